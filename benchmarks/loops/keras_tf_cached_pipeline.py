"""Fit a small image classifier with Keras (TensorFlow backend) on a tf.data pipeline that
caches the decoded images in memory: a run with no memory problem, whose memory climbs
through the whole first epoch.

The images arrive as JPEG bytes (6144 of them, 64x64, about 2 KiB each). The pipeline
decodes each one and scales it to floats, then `cache()`s the result, so later epochs
skip the decoding; after the cache come the shuffle, a random flip, batching and
prefetching. During the first epoch the cache fills as the batches go by, 48 KiB an
image, 3 MiB a batch of 64, 288 MiB at the epoch's end: memory rises step after step for
all 96 steps, as a leak would (about 300 MiB in all, with the shuffle buffer). Then the
cache is complete and the second and third epochs read from it: memory stays within a few
dozen MiB of where the first epoch left it. 288 MiB is the bound, it fits with hundreds of
MiB to spare, and the fit finishes.
"""

from __future__ import annotations

import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf

BUDGET_BYTES = 1280 << 20  # as on a machine with 1.25 GiB to spare
SIDE, CLASSES, IMAGES, BATCH = 64, 6, 6144, 64


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_jpegs(rng: np.random.Generator) -> tuple[list[bytes], np.ndarray]:
    """Stands in for a folder of photos: each class is a stripe at its own angle."""
    labels = rng.integers(0, CLASSES, IMAGES)
    rows, columns = np.mgrid[0:SIDE, 0:SIDE]
    jpegs = []
    for label in labels:
        angle = np.pi * label / CLASSES
        stripes = np.sin((rows * np.cos(angle) + columns * np.sin(angle)) / 3.0)
        noise = rng.normal(0.0, 0.3, (SIDE, SIDE, 3))
        pixels = np.clip(127 + 80 * stripes[..., None] + 40 * noise, 0, 255).astype(np.uint8)
        jpegs.append(tf.io.encode_jpeg(pixels, quality=85).numpy())
    return jpegs, labels.astype(np.int32)


def decode(jpeg: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    image = tf.io.decode_jpeg(jpeg, channels=3)
    image = tf.ensure_shape(image, (SIDE, SIDE, 3))
    return tf.cast(image, tf.float32) / 255.0, label


def augment(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.image.random_flip_left_right(image), label


def make_pipeline(jpegs: list[bytes], labels: np.ndarray) -> tf.data.Dataset:
    return (
        tf.data.Dataset.from_tensor_slices((jpegs, labels))
        .map(decode, num_parallel_calls=2)
        .cache()  # decoded floats, in memory: filled by the first epoch, read by the others
        .shuffle(1024, seed=0)
        .map(augment, num_parallel_calls=2)
        .batch(BATCH)
        .prefetch(2)
    )


def make_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.Input((SIDE, SIDE, 3)),
            tf.keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    tf.keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    jpegs, labels = make_jpegs(np.random.default_rng(0))
    print(f"{len(jpegs)} images, {sum(map(len, jpegs)) >> 10} KiB of JPEG", flush=True)
    model = make_model()
    model.fit(make_pipeline(jpegs, labels), epochs=3, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
