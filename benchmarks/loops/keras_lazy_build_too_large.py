"""Train a Keras recommender (TensorFlow backend) whose embedding table does not fit.

A matrix-factorisation model with one 64-wide embedding per user and per item. The user
table was sized for the whole catalogue of five million users: 1.2 GiB of float32 weights
alone, more than the memory there is. The model is built lazily: the weights are created
when it is first called, on a sample batch to print its summary before `fit`, and it runs
out there, before any step trains.
(Hash the users into fewer rows, or train the table sharded or in lower precision.)
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
USERS, ITEMS, DIM, ROWS, BATCH = 5_000_000, 20_000, 64, 65536, 1024


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class MatrixFactorisation(tf.keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.users = tf.keras.layers.Embedding(USERS, DIM)
        self.items = tf.keras.layers.Embedding(ITEMS, DIM)

    def call(self, pairs: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(self.users(pairs[:, 0]) * self.items(pairs[:, 1]), axis=-1)


def main() -> None:
    tf.keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    pairs = np.stack([rng.integers(0, USERS, ROWS), rng.integers(0, ITEMS, ROWS)], axis=1)
    ratings = rng.uniform(1, 5, ROWS).astype(np.float32)
    model = MatrixFactorisation()
    model(pairs[:2])  # builds the weights
    model.summary()
    model.compile(optimizer="adam", loss="mse")
    model.fit(pairs, ratings, batch_size=BATCH, epochs=2, verbose=2)


if __name__ == "__main__":
    main()
