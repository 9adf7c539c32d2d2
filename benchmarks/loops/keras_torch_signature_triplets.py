"""Train a signature-verification embedding with Keras (torch backend) and a batch-all
triplet loss that builds every (anchor, positive, negative) triple of the batch at once.

Each example is a scanned handwritten signature, 32 x 64 grey pixels, and the model, a
small strided CNN, maps it to a 64-dimensional unit vector so that signatures of one
writer lie close together. Batches are drawn writer by writer (P x K sampling): 64
writers x 16 signatures, 1024 images (8 MiB). The loss is the "batch-all" triplet loss as
it is often copied: the (1024, 1024) matrix of squared distances, then
`distances[:, :, None] - distances[:, None, :] + margin` for every anchor, positive and
negative, masked to the valid triples afterwards. That is a (1024, 1024, 1024) tensor,
4 GiB of float32 in one request (and 1 GiB for each boolean mask), asked for in the first
step of fit against 1 GiB of memory, while everything else the step holds, the model
(about 27,000 weights), its Adam state, the batch and its activations, takes under
400 MiB. (Batch-hard mining, the hardest positive and hardest negative of each anchor
taken from the (1024, 1024) distance matrix, 4 MiB, trains under the same cap.)
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import torch
from keras import ops

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
HEIGHT, WIDTH, HARMONICS, POINTS = 32, 64, 5, 256
ALL_WRITERS, WRITERS, PER_WRITER, BATCHES, MARGIN = 2000, 64, 16, 24, 0.2
BATCH = WRITERS * PER_WRITER


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Signatures(keras.utils.PyDataset):
    """Stands in for a folder of scanned signatures: each writer's pen path is a sum of a
    few loops of their own, drawn each time with a little tremor and slant."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.amplitudes = rng.uniform(0.2, 1.0, (ALL_WRITERS, 2, HARMONICS)).astype(np.float32)
        self.phases = rng.uniform(0, 2 * np.pi, (ALL_WRITERS, 2, HARMONICS)).astype(np.float32)
        self.time = np.linspace(0, 2 * np.pi, POINTS, dtype=np.float32)
        self.orders = np.arange(1, HARMONICS + 1, dtype=np.float32)

    def __len__(self) -> int:
        return BATCHES

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(1000 + index)
        writers = rng.choice(ALL_WRITERS, WRITERS, replace=False)
        labels = np.repeat(writers, PER_WRITER)
        amplitudes = self.amplitudes[labels] * (
            1 + 0.05 * rng.standard_normal((BATCH, 2, HARMONICS), dtype=np.float32)
        )
        phases = self.phases[labels] + 0.1 * rng.standard_normal(
            (BATCH, 2, HARMONICS), dtype=np.float32
        )
        waves = np.sin(self.orders[:, None] * self.time + phases[..., None])
        path = np.einsum("bak,bakt->bat", amplitudes, waves)  # (BATCH, 2, POINTS)
        path[:, 0] += rng.uniform(-0.3, 0.3, (BATCH, 1)) * path[:, 1]  # slant
        low, high = path.min(axis=2, keepdims=True), path.max(axis=2, keepdims=True)
        path = (path - low) / (high - low + 1e-6)
        rows = np.clip((path[:, 1] * (HEIGHT - 1)).round().astype(np.int64), 0, HEIGHT - 1)
        columns = np.clip((path[:, 0] * (WIDTH - 1)).round().astype(np.int64), 0, WIDTH - 1)
        images = np.zeros((BATCH, HEIGHT * WIDTH), np.float32)
        images[np.arange(BATCH)[:, None], rows * WIDTH + columns] = 1.0  # ink
        return images.reshape(BATCH, HEIGHT, WIDTH, 1), labels.astype(np.float32)


def batch_all_triplet_loss(labels, embeddings):
    """Mean hinge loss over every valid triple with a positive loss."""
    labels = ops.reshape(labels, (-1,))
    dot = ops.matmul(embeddings, ops.transpose(embeddings))
    squared = ops.diagonal(dot)
    distances = ops.maximum(squared[:, None] - 2.0 * dot + squared[None, :], 0.0)
    # BUG: every (anchor, positive, negative) of the batch at once: (1024, 1024, 1024)
    triplets = distances[:, :, None] - distances[:, None, :] + MARGIN
    same = ops.equal(labels[:, None], labels[None, :])
    positive = ops.logical_and(same, ops.logical_not(ops.eye(BATCH, dtype="bool")))
    valid = ops.logical_and(positive[:, :, None], ops.logical_not(same)[:, None, :])
    losses = ops.maximum(triplets, 0.0) * ops.cast(valid, "float32")
    active = ops.sum(ops.cast(losses > 1e-16, "float32"))
    return ops.sum(losses) / (active + 1e-16)


def make_model() -> keras.Model:
    signature = keras.Input((HEIGHT, WIDTH, 1))
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(signature)
    x = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(64)(x)
    model = keras.Model(signature, keras.layers.UnitNormalization()(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=batch_all_triplet_loss)
    return model


def main() -> None:
    keras.utils.set_random_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = make_model()
    print(
        f"signature embedder: {model.count_params()} weights, batch {BATCH} "
        f"({WRITERS} writers x {PER_WRITER})",
        flush=True,
    )
    model.fit(Signatures(), epochs=3, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
