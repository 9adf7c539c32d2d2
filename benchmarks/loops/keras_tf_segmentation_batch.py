"""Fit a small Keras segmentation net (TensorFlow backend) with a batch far too large.

A fully convolutional net labels every pixel of 96x96 images. Its feature maps stay at
full resolution, so each image's activations (kept for the backward pass) and their
gradients are a few MiB, and the batch of 512 set for a bigger machine needs several times
the memory there is: the first step of `fit` runs out. A batch of 16 trains under the same
cap.
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf

BUDGET_BYTES = 1536 << 20  # as on a machine with 1.5 GiB to spare
SIDE, CLASSES, ROWS, BATCH = 96, 4, 1024, 512


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((SIDE, SIDE, 3)),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(CLASSES, 1),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def make_masks(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Images of a few bright squares, each pixel labelled by the square's colour."""
    images = rng.random((ROWS, SIDE, SIDE, 3), dtype=np.float32) * 0.2
    masks = np.zeros((ROWS, SIDE, SIDE), dtype=np.int32)
    for row in range(ROWS):
        for label in range(1, CLASSES):
            y, x = rng.integers(0, SIDE - 24, 2)
            masks[row, y : y + 24, x : x + 24] = label
            images[row, y : y + 24, x : x + 24, label - 1] += 0.8
    return images, masks


def main() -> None:
    tf.keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    images, masks = make_masks(np.random.default_rng(0))
    model = make_model()
    model.fit(images, masks, batch_size=BATCH, epochs=2, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
