"""Fit a Keras MLP with the PyTorch backend on a dataset that caches decoded batches.

The `PyDataset` decodes each batch (standing in for parsing records) and keeps the 24
most recently used batches in an LRU cache. Memory rises while the cache fills during the
first epoch, then stays flat: the cache is bounded and the run has room for it. No memory
problem; the fit finishes.
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import torch

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
FEATURES, HIDDEN, CLASSES, BATCHES, BATCH = 1024, 256, 10, 48, 512
CACHED_BATCHES = 24  # 2 MiB each


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class DecodedRecords(keras.utils.PyDataset):
    """Batches decoded on demand, the most recent ones kept in a bounded cache."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return BATCHES

    def decode(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(index)
        labels = rng.integers(0, CLASSES, BATCH)
        features = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
        features[:, :CLASSES] += 3 * np.eye(CLASSES, dtype=np.float32)[labels]
        return features, labels

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if index in self.cache:
            self.cache.move_to_end(index)
            return self.cache[index]
        batch = self.cache[index] = self.decode(index)
        if len(self.cache) > CACHED_BATCHES:
            self.cache.popitem(last=False)
        return batch


def main() -> None:
    keras.utils.set_random_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(DecodedRecords(), epochs=3, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
