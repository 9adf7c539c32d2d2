"""A Keras model (TensorFlow backend) whose embedding table does not fit, built lazily by
calling it once on a sample before `fit`, under an address-space cap 512 MiB above what
the process maps after TensorFlow starts: the table's random initializer runs out (a
3 million x 64 float32 table is 732 MiB), before any step."""

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf

tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (512 << 20), hard))

model = tf.keras.Sequential([tf.keras.layers.Embedding(3_000_000, 64), tf.keras.layers.Dense(1)])
ids = np.zeros((2, 8), dtype=np.int32)
model(ids)  # builds the weights
model.compile("adam", "mse")
model.fit(ids, np.zeros((2, 8, 1), dtype=np.float32), epochs=1, verbose=0)
