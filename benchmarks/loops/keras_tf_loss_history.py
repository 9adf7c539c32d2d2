"""Fit a Keras MLP (TensorFlow backend) with validation, early stopping and a callback that
records the loss after every batch: a run with no memory problem.

The callback appends `logs["loss"]` to a list after every batch, for a loss curve at the
end. Keras hands callbacks Python floats, so the list grows by a few dozen bytes a step,
not by tensors; validation runs after each epoch and nothing else is kept. Memory rises
while the step and the validation step are traced, then stays flat, and the fit finishes.
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf

BUDGET_BYTES = 1280 << 20  # as on a machine with 1.25 GiB to spare
FEATURES, HIDDEN, CLASSES, ROWS, HELD, BATCH = 128, 256, 8, 8192, 4096, 64


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class LossHistory(tf.keras.callbacks.Callback):
    """Keeps the training loss after every batch (a float), to plot the curve at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.losses.append(float(logs["loss"]))

    def on_train_end(self, logs: dict | None = None) -> None:
        tail = self.losses[-50:]
        print(f"{len(self.losses)} batches, last 50 mean loss {sum(tail) / len(tail):.3f}")


def make_rows(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(1).standard_normal((CLASSES, FEATURES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, count)
    features = centers[labels] + 2 * rng.standard_normal((count, FEATURES), dtype=np.float32)
    return features, labels


def main() -> None:
    tf.keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    features, labels = make_rows(rng, ROWS)
    held = make_rows(rng, HELD)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((FEATURES,)),
            tf.keras.layers.Dense(HIDDEN, activation="relu"),
            tf.keras.layers.Dropout(0.1),
            tf.keras.layers.Dense(HIDDEN, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [
        LossHistory(),
        tf.keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True),
    ]
    model.fit(
        features,
        labels,
        batch_size=BATCH,
        epochs=3,
        validation_data=held,
        verbose=2,
        callbacks=callbacks,
    )
    print("fit finished")


if __name__ == "__main__":
    main()
