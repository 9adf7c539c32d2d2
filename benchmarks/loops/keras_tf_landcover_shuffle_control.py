"""Fit a land-cover classifier on multispectral satellite patches with Keras (TensorFlow
backend) from a tf.data pipeline that shuffles after decoding: a run with no memory
problem, whose memory jumps at the start of every epoch and drains away through its end.

Each training example is a 64 x 64 patch of a 13-band Sentinel-2-like scene (208 KiB of
float32) labelled with one of 10 land-cover classes, 6144 patches an epoch, decoded on the
fly from their index (standing in for reading GeoTIFF tiles). The pipeline is
`range -> map(decode) -> shuffle(2048) -> batch(64) -> prefetch`, so the shuffle buffer
holds 2048 decoded patches, 416 MiB: at the start of every epoch it fills before the first
batch comes out, a jump of about 400 MiB in a second or two; it stays full while the
decoder keeps it topped up, and drains over the last 32 of the epoch's 96 batches, when
there is nothing left to decode, back to where the epoch started (after the first epoch
about 250 MiB higher than before it, TensorFlow's caches and traced functions, and no
higher after that). The next epoch's iterator fills it again. Three epochs, with a
1024-patch validation (no shuffle) after each: a saw-tooth of the same height every
epoch, nothing kept between epochs, all within the 2 GiB cap (about 1.3 GiB above what is
mapped after the imports at the peak, thread arenas included), and the fit finishes.
(Shuffling the indices before decoding would keep only a few batches; but nothing here
needs fixing.)
"""

from __future__ import annotations

import ctypes
import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import numpy as np
import tensorflow as tf

BUDGET_BYTES = 2048 << 20  # as on a machine with 2 GiB to spare
BANDS, SIDE, CLASSES = 13, 64, 10
TRAIN, VALID, BUFFER, BATCH, EPOCHS = 6144, 1024, 2048, 64, 3


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_decoder() -> callable:
    """Stands in for reading a tile: every land-cover class has its own spectrum and a
    coarse texture, under sensor noise."""
    rng = np.random.default_rng(0)
    spectra = tf.constant(rng.uniform(0.0, 1.0, (CLASSES, BANDS)), tf.float32)
    textures = tf.constant(rng.standard_normal((CLASSES, 8, 8, 1)), tf.float32)
    textures = tf.image.resize(textures, (SIDE, SIDE))  # a coarse texture a class

    def decode(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        label = tf.cast((index * 7919) % CLASSES, tf.int32)
        seed = tf.stack([index, tf.constant(17, tf.int64)])
        noise = tf.random.stateless_normal((SIDE, SIDE, BANDS), seed=seed)
        texture = tf.gather(textures, label)
        patch = tf.gather(spectra, label) * (1.0 + 0.3 * texture) + 0.4 * noise
        return patch, label

    return decode


def make_datasets() -> tuple[tf.data.Dataset, tf.data.Dataset]:
    decode = make_decoder()
    train = (
        tf.data.Dataset.range(TRAIN)
        .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .shuffle(BUFFER, seed=0)  # holds 8192 decoded patches, refilled every epoch
        .batch(BATCH)
        .prefetch(2)
    )
    valid = tf.data.Dataset.range(TRAIN, TRAIN + VALID).map(decode).batch(256)
    return train, valid


def make_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((SIDE, SIDE, BANDS)),
            keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    # Allocations of 128 KiB and more get their own mappings, returned when freed, as a
    # device's caching allocator keeps large blocks apart from small ones: otherwise the
    # decoded patches, scattered over glibc's heap, keep it from shrinking.
    ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
    # Two malloc arenas, not one a thread: tf.data's and TensorFlow's thread pools would
    # otherwise each reserve 64 MiB of address space that the cap counts.
    ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX
    keras.utils.set_random_seed(0)
    tf.ones(4).numpy()  # start TensorFlow's thread pools before the cap: their stacks count
    cap_address_space(BUDGET_BYTES)
    train, valid = make_datasets()
    model = make_model()
    patch_mib = SIDE * SIDE * BANDS * 4 / 2**20
    print(
        f"{model.count_params()} weights; shuffle buffer {BUFFER} patches "
        f"({BUFFER * patch_mib:.0f} MiB)",
        flush=True,
    )
    model.fit(train, validation_data=valid, epochs=EPOCHS, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
