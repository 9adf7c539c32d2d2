"""A Keras `fit` (TensorFlow backend) whose job setup, inside the program, gives TensorFlow's
CPU allocator BFC with a 64 MiB limit: an ordinary MLP and batch of 2048 run out at that
limit in the first step, with the machine's memory free. TensorFlow reads its allocator's
counters after the failed op has freed what it made: in use then is below the limit, the
most in use by then is at it."""

import os

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = "64"
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # oneDNN kernels crash on a BFC OOM on the CPU
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

x = np.random.default_rng(0).random((8192, 256), dtype=np.float32)
y = np.zeros((8192,), dtype=np.int64)
model = tf.keras.Sequential(
    [tf.keras.Input((256,)), tf.keras.layers.Dense(1024, activation="relu"),
     tf.keras.layers.Dense(1024, activation="relu"), tf.keras.layers.Dense(10)]
)  # fmt: skip
model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=2048, epochs=2, verbose=0)
print("fit finished")
