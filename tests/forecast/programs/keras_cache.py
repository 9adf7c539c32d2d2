"""A Keras `fit` (TensorFlow backend) over three epochs of a tf.data pipeline that caches its
decoded examples in memory, on TensorFlow's BFC allocator on the CPU with a limit.

Usage: keras_cache.py MODE [LIMIT_MB]. MODE "cache": the cache fills during the first epoch
(2 MiB a step for 60 steps), then the later epochs read it and memory stays flat. MODE
"leak": no cache; a callback keeps a 2 MiB tensor every batch of every epoch. memdoc sees
`fit`'s steps and epochs with no code change.
"""

from __future__ import annotations

import os
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "cache"
LIMIT_MB = sys.argv[2] if len(sys.argv) > 2 else "120"
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = LIMIT_MB
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

BATCH, STEPS, WIDTH = 64, 60, 8192  # a decoded example: 32 KiB; a batch of them: 2 MiB
EPOCHS = 3


class KeepsEveryBatch(tf.keras.callbacks.Callback):
    """The leak: a 2 MiB tensor kept for every batch trained."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[tf.Tensor] = []

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.kept.append(tf.random.normal((BATCH, WIDTH)))


def main() -> None:
    seeds = np.arange(BATCH * STEPS, dtype=np.int64)
    labels = (seeds % 2).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((seeds, labels))

    def decode(seed: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        # Stands in for decoding a file: a new 32 KiB float tensor per example.
        return tf.random.stateless_normal((WIDTH,), seed=tf.stack([seed, seed])), label

    data = data.map(decode)
    callbacks: list[tf.keras.callbacks.Callback] = []
    if MODE == "cache":
        data = data.cache()
    else:
        callbacks.append(KeepsEveryBatch())
    data = data.batch(BATCH)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((WIDTH,)),
            tf.keras.layers.Dense(256, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="sgd", loss="mse")
    model.fit(data, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    print("done", flush=True)


if __name__ == "__main__":
    main()
