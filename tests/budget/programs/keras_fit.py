"""Keras `fit` (TensorFlow backend) on the CPU: a dense model (1024 -> 1024 -> 1024) fitted
for one epoch of 30 steps, the batch size from argv (default 256).

LEAK=1: a callback keeps a copy of the first layer's 4 MiB kernel after every batch, for a
hand-made average it never computes: the memory grows every step."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

STEPS = 30
BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 256
LEAK = os.environ.get("LEAK") == "1"


class KernelCopies(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.copies: list[np.ndarray] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.copies.append(self.model.layers[0].kernel.numpy().copy())


keras.utils.set_random_seed(0)
model = keras.Sequential(
    [keras.Input((1024,)), keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1024)]
)
model.compile(optimizer="adam", loss="mse")
x = np.random.default_rng(0).standard_normal((STEPS * BATCH, 1024), dtype=np.float32)
model.fit(x, x, batch_size=BATCH, verbose=0, callbacks=[KernelCopies()] if LEAK else [])
print("trained", STEPS, "steps")
