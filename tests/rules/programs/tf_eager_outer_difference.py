"""One eager TensorFlow operation whose float32 result (60,000 x 60,000, 13.4 GiB) is five
times the 1 GiB of address space the process allows itself beyond what it maps once
TensorFlow has started: half of it in a narrower dtype would not fit either, the near miss
of no-mixed-precision."""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

(tf.random.normal((64, 64)) + 1.0).numpy()  # TensorFlow's thread pools start before the cap
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))
column, row = tf.random.normal((60000, 1)), tf.random.normal((1, 60000))
difference = column - row  # one eager op: a 60000 x 60000 float32 result
print(difference.shape)
