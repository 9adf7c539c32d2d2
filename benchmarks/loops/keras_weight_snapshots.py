"""Fit a Keras MLP (TensorFlow backend) with a callback that snapshots the weights.

The callback keeps `model.get_weights()` after every batch, to average the last weights
by hand at the end (a home-made stochastic weight averaging). Each snapshot is a full copy
of the model (about 10 MiB), so memory grows by one model a step until it runs out after
some dozens of steps. (Keep a running average instead.)
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf

BUDGET_BYTES = 1 << 30  # as on a machine with 1 GiB to spare
FEATURES, HIDDEN, CLASSES, ROWS, BATCH = 256, 1024, 10, 12800, 128


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class WeightAverage(tf.keras.callbacks.Callback):
    """Averages the weights seen after each batch and loads the average at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshots: list[list[np.ndarray]] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.snapshots.append(self.model.get_weights())  # BUG: a full copy every batch

    def on_train_end(self, logs: dict | None = None) -> None:
        average = [np.mean(arrays, axis=0) for arrays in zip(*self.snapshots, strict=True)]
        self.model.set_weights(average)


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
    model.fit(features, labels, batch_size=BATCH, epochs=3, verbose=2, callbacks=[WeightAverage()])


if __name__ == "__main__":
    main()
