"""A tiny real Keras fit with memdoc's callback; `oom` makes a training step exceed the TF pool."""

import json
import sys

import keras
import numpy as np

from memdoc.integrations.keras import MemdocCallback

trace, mode, result = sys.argv[1], sys.argv[2], sys.argv[3]


class Huge(keras.layers.Layer):
    """Adds a 160 MB temporary to the activations: more than the capped CPU pool holds.

    Built from the input, so that the graph optimizer cannot fold it into a constant.
    """

    def call(self, x):
        big = keras.ops.tile(x, (4_000_000, 1))
        return x + keras.ops.sum(big) * 0.0


layers = [keras.Input((8,)), keras.layers.Dense(2)]
if mode == "oom":
    layers.append(Huge())
model = keras.Sequential(layers)
model.compile(optimizer="sgd", loss="mse")
x = np.random.rand(20, 8).astype("float32")
y = np.random.rand(20, 2).astype("float32")
callback = MemdocCallback(trace)
error = None
try:
    model.fit(x, y, batch_size=5, epochs=2, validation_data=(x, y), callbacks=[callback], verbose=0)
except Exception as exc:
    error = f"{type(exc).__name__}: {str(exc)[-600:]}"
    callback.finish(exc)  # Keras has no exception hook: where the fit is caught, say so
with open(result, "w") as out:
    json.dump({"batches": 2 * 4, "diagnosis": callback.diagnosis, "error": error}, out)
