"""A Keras model whose activations grow with the batch, on TensorFlow's BFC allocator on the
CPU with a memory limit (as on a GPU, where the BFC allocator owns the device's memory).

Usage: tf_batch.py BATCH [LIMIT_MB] [STEPS]. Steps are marked with memdoc.step() when memdoc
is present. A batch too large ends with TensorFlow's ResourceExhaustedError.
"""

from __future__ import annotations

import os
import sys

BATCH = int(sys.argv[1])
LIMIT_MB = sys.argv[2] if len(sys.argv) > 2 else "300"
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
SEQ, WIDTH = 64, 128
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
            tf.keras.Input((SEQ, WIDTH)),
            tf.keras.layers.Dense(WIDTH, activation="gelu"),
            tf.keras.layers.LayerNormalization(),
            tf.keras.layers.Dense(WIDTH, activation="gelu"),
            tf.keras.layers.Dense(1),
        ]
    )
    optimizer = tf.keras.optimizers.Adam(1e-3)

    @tf.function
    def train_step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for step in range(1, STEPS + 1):
        train_step(tf.random.normal((BATCH, SEQ, WIDTH))).numpy()
        mark_step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
