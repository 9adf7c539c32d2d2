"""Fit a small Keras conv net with the JAX backend and a batch far too large.

The batch of 1024 images of 64x64 pixels was copied from a run on a larger machine. Keras
compiles the training step with `jax.jit`; its working set (the feature maps of the first
convolutions, kept for the backward pass, and their gradients) is several times the memory
there is, and the first step runs out. A batch of 64 trains.
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "jax"

import jax
import jax.numpy as jnp
import keras
import numpy as np

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
SIDE, CLASSES, ROWS, BATCH = 64, 10, 2048, 1024


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((SIDE, SIDE, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(4),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    keras.utils.set_random_seed(0)
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    images = rng.random((ROWS, SIDE, SIDE, 3), dtype=np.float32)
    labels = rng.integers(0, CLASSES, ROWS)
    model = make_model()
    model.fit(images, labels, batch_size=BATCH, epochs=2, verbose=2)


if __name__ == "__main__":
    main()
