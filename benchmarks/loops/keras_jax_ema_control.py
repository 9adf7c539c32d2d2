"""Fit a topic classifier with Keras (JAX backend) and Adam keeping an exponential moving
average of the weights: a run with no memory problem, whose memory steps up once.

The model is mostly a 50,000-word embedding table (12 MiB). When `fit` builds the
optimizer, just before the first step, Adam adds its two moments and `use_ema=True` a
third copy of every weight, the moving average: memory steps up by about three tables at
once, which can look like the start of a leak or like optimizer state that does not fit.
It is neither: nothing is added after that, each validation pass (batches of 4096 reviews,
a 64 MiB embedding lookup among XLA's temporaries) makes memory jump and fall back, the
steps in between stay flat, and the fit finishes far inside the memory, ending with the
moving average copied into the weights.
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "jax"

import jax
import jax.numpy as jnp
import keras
import numpy as np

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, WIDTH, SEQ, CLASSES, TRAIN, HELD_OUT, BATCH = 50_000, 64, 64, 4, 8192, 4096, 128


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_model() -> keras.Model:
    ids = keras.Input((SEQ,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, WIDTH)(ids)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    hidden = keras.layers.Dense(128, activation="relu")(hidden)
    model = keras.Model(ids, keras.layers.Dense(CLASSES)(hidden))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3, use_ema=True, ema_momentum=0.99),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def make_articles(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for tokenised news: each topic draws a fifth of its words from its own list."""
    labels = rng.integers(0, CLASSES, count)
    ids = rng.integers(0, VOCAB, (count, SEQ))
    cue = rng.random((count, SEQ)) < 0.2
    ids[cue] = (labels[:, None] * 1000 + ids % 1000)[cue]
    return ids.astype(np.int32), labels.astype(np.int32)


def main() -> None:
    keras.utils.set_random_seed(0)
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    train_ids, train_labels = make_articles(rng, TRAIN)
    held_ids, held_labels = make_articles(rng, HELD_OUT)
    model = make_model()
    model.fit(
        train_ids,
        train_labels,
        batch_size=BATCH,
        epochs=3,
        validation_data=(held_ids, held_labels),
        validation_batch_size=HELD_OUT,
        verbose=2,
    )
    print("fit finished")


if __name__ == "__main__":
    main()
