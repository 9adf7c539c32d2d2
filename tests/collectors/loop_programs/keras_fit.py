"""Keras `fit` with validation, then `evaluate` and `predict`, with no memdoc callback.

Train 256 samples in batches of 32 (8 steps an epoch) for 3 epochs, with Adam; the backend is
KERAS_BACKEND's (the test sets it)."""

import keras
import numpy as np

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile("adam", "mse")
x = np.random.rand(320, 8).astype("float32")
y = np.random.rand(320, 1).astype("float32")
model.fit(x, y, batch_size=32, epochs=3, validation_split=0.2, verbose=0)
model.evaluate(x, y, verbose=0)
model.predict(x, verbose=0)
