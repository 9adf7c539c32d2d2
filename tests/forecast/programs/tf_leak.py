"""A Keras model trained step by step that keeps each step's activations (a leak), on
TensorFlow's BFC allocator on the CPU with a memory limit.

Usage: tf_leak.py [LEAK_MIB] [LIMIT_MB]. Steps are marked with memdoc.step() when memdoc is
present. Ends with TensorFlow's ResourceExhaustedError when the allocator's limit is reached.
"""

from __future__ import annotations

import os
import sys

LEAK_MIB = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
LIMIT_MB = sys.argv[2] if len(sys.argv) > 2 else "400"
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = LIMIT_MB
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

try:
    from memdoc import step as mark_step
except ImportError:  # runs without memdoc too

    def mark_step() -> None:
        pass


def main() -> None:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((256,)),
            tf.keras.layers.Dense(256, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    optimizer = tf.keras.optimizers.SGD(0.01)
    kept = []
    rows = int(LEAK_MIB * (1 << 20)) // (256 * 4)
    for step in range(1, 100_000):
        x = tf.random.normal((64, 256))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        kept.append(tf.random.normal((rows, 256)))  # the leak
        mark_step()
        print(f"step {step}", flush=True)


if __name__ == "__main__":
    main()
