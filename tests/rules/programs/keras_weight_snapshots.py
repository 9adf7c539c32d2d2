"""Keras `fit` (TensorFlow backend) on the CPU with a callback that keeps `get_weights()`
after every batch for a hand-made average: a copy of the model's 8 MiB of weights a step,
under an address-space cap 320 MiB above what the process maps once the model is built.
It runs out some dozens of steps into the fit.

FIX=ema: memdoc's fix, under the same cap: the optimizer keeps one moving average
(`use_ema=True`) and the callback goes; all 160 steps train."""

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

FIX = os.environ.get("FIX") == "ema"
ROWS, BATCH = 160 * 32, 32


class WeightSnapshots(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.snapshots: list[list[np.ndarray]] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.snapshots.append(self.model.get_weights())


model = keras.Sequential(
    [keras.Input((1024,)), keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1024)]
)
model.compile(optimizer=keras.optimizers.SGD(1e-3, use_ema=FIX), loss="mse")
x = np.ones((ROWS, 1024), np.float32)
model.fit(x[:BATCH], x[:BATCH], batch_size=BATCH, verbose=0)  # built and traced once
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (320 << 20), hard))
model.fit(x, x, batch_size=BATCH, verbose=0, callbacks=[] if FIX else [WeightSnapshots()])
print("trained", ROWS // BATCH, "steps")
