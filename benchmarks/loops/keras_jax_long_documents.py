"""Fit a small transformer document classifier with Keras (JAX backend) after its maximum
length was raised from 512 to 2048 tokens.

Two encoder blocks of `keras.layers.MultiHeadAttention` (4 heads, width 128) read reviews
truncated to MAX_TOKENS and a dense head classifies them; the weights are small (1.7
million parameters, under 7 MiB). Attention compares every token with every other: one
block's attention weights for a batch of 16 are 16 x 4 x 2048 x 2048 floats, 1 GiB, and
the jitted training step keeps the scores, the softmax and their gradients of both blocks
among XLA's temporaries, 9.3 GB in one request. Raising the length from 512 to 2048 made
that working set 12 times larger, far beyond the memory, and the first step of `fit` runs
out; on the CPU, JAX may report it only when `fit` next reads a result, at the epoch's
end, every step after the first having failed the same way. (At MAX_TOKENS = 512 the
step's temporaries are 750 MB and the same fit trains under the same cap; to keep 2048
tokens, use a smaller batch and an attention that does not store the whole matrix.)
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "jax"

import jax
import jax.numpy as jnp
import keras
import numpy as np

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
VOCAB, WIDTH, HEADS, BLOCKS, CLASSES = 8000, 128, 4, 2, 2
MAX_TOKENS = 2048  # BUG: was 512; attention's working set grows with its square
DOCUMENTS, BATCH = 512, 16


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class TokenAndPosition(keras.layers.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = keras.layers.Embedding(VOCAB, WIDTH)
        self.positions = keras.layers.Embedding(MAX_TOKENS, WIDTH)

    def call(self, ids):
        return self.tokens(ids) + self.positions(keras.ops.arange(keras.ops.shape(ids)[1]))


def encoder_block(hidden):
    attended = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(hidden, hidden)
    hidden = keras.layers.LayerNormalization()(hidden + attended)
    widened = keras.layers.Dense(4 * WIDTH, activation="gelu")(hidden)
    return keras.layers.LayerNormalization()(hidden + keras.layers.Dense(WIDTH)(widened))


def make_model() -> keras.Model:
    ids = keras.Input((MAX_TOKENS,), dtype="int32")
    hidden = TokenAndPosition()(ids)
    for _ in range(BLOCKS):
        hidden = encoder_block(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(ids, keras.layers.Dense(CLASSES)(pooled))
    model.compile(
        optimizer=keras.optimizers.AdamW(3e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def make_documents(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for tokenised long reviews: positive ones use the first 500 words more."""
    labels = rng.integers(0, CLASSES, DOCUMENTS)
    ids = rng.integers(500, VOCAB, (DOCUMENTS, MAX_TOKENS))
    cue = (rng.random((DOCUMENTS, MAX_TOKENS)) < 0.1) & (labels[:, None] == 1)
    ids[cue] %= 500
    return ids.astype(np.int32), labels.astype(np.int32)


def main() -> None:
    keras.utils.set_random_seed(0)
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    ids, labels = make_documents(np.random.default_rng(0))
    model = make_model()
    model.fit(ids, labels, batch_size=BATCH, epochs=2, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
