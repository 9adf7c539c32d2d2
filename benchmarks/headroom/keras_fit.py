"""A Keras MLP trained with `fit` (TensorFlow backend) under a 200 MiB budget.

Usage: keras_fit.py BATCH. Trains 12 steps (one epoch of 12 batches) on in-memory arrays;
memdoc counts the steps from Keras's own callbacks.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import numpy as np
import tensorflow as tf
from _cap import cap_address_space, steady_malloc

BATCH = int(sys.argv[1])
BUDGET_MIB, STEPS = 200, 12
FEATURES, HIDDEN, CLASSES = 4096, 256, 10


def main() -> None:
    steady_malloc()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((FEATURES,)),
            tf.keras.layers.Dense(HIDDEN, activation="relu"),
            tf.keras.layers.Dense(HIDDEN, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH * STEPS)
    model.predict(x[:2], verbose=0)  # start the runtime's threads before the cap
    cap_address_space(BUDGET_MIB)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    print("done", flush=True)


if __name__ == "__main__":
    main()
