"""Fit a Keras MLP (TensorFlow backend) under an allocator limit left in the job's setup.

The job's environment sets TensorFlow's CPU allocator to BFC with a 64 MiB limit
(`TF_CPU_BFC_MEM_LIMIT_IN_MB`), a line kept from a setup where several jobs shared one
host. The model and the batch are ordinary and the process has more than a GiB to spare,
but the allocator refuses to go past its configured limit: the first step runs out with
TensorFlow's own OOM error. Removing or raising the limit is the fix.
"""

from __future__ import annotations

import os
import resource

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # the job's setup, kept from a shared host
os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = "64"
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # oneDNN kernels crash on a BFC OOM on the CPU
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf

BUDGET_BYTES = 1536 << 20  # the process itself could still map 1.5 GiB more
FEATURES, HIDDEN, CLASSES, ROWS, BATCH = 256, 1024, 10, 16384, 2048


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((FEATURES,)),
            tf.keras.layers.Dense(HIDDEN, activation="relu"),
            tf.keras.layers.Dense(HIDDEN, activation="relu"),
            tf.keras.layers.Dense(HIDDEN, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    tf.keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    features = rng.standard_normal((ROWS, FEATURES), dtype=np.float32)
    labels = rng.integers(0, CLASSES, ROWS)
    model = make_model()
    model.fit(features, labels, batch_size=BATCH, epochs=2, verbose=2)


if __name__ == "__main__":
    main()
