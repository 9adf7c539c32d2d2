"""Fit a Keras text classifier (PyTorch backend) with a callback that evaluates it by hand.

At each epoch's end the callback runs the model over a held-out set in large batches and
keeps every batch's probabilities for a calibration report. Keras' own `evaluate` and
`predict` turn autograd off; this hand-written loop calls the model directly, and with the
PyTorch backend the weights require gradients, so every kept probability tensor holds its
batch's graph (the per-token hidden activations). Memory grows batch after batch until
the first evaluation runs out. Under `torch.no_grad()` the kept probabilities are a few
KiB a batch.
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import torch

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
VOCAB, SEQ, DIM, HIDDEN, CLASSES = 10000, 128, 64, 128, 3
TRAIN_ROWS, HELD_ROWS, BATCH, EVAL_BATCH = 512, 8192, 64, 512


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_rows(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for tokenised reviews: the label shifts which words are common."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, count)
    words = rng.integers(0, VOCAB // CLASSES, (count, SEQ))
    words[:, ::3] += (VOCAB // CLASSES) * labels[:, None]
    return words, labels


class Calibration(keras.callbacks.Callback):
    """Expected calibration error on held-out rows, computed by hand at each epoch's end."""

    def __init__(self, held: tuple[np.ndarray, np.ndarray]) -> None:
        super().__init__()
        self.held = held

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # BUG: no torch.no_grad(): each kept tensor keeps its batch's graph
        words, labels = self.held
        probabilities = []
        for start in range(0, len(words), EVAL_BATCH):
            batch = torch.from_numpy(words[start : start + EVAL_BATCH])
            probabilities.append(keras.ops.softmax(self.model(batch, training=False)))
        confidence, predicted = torch.cat(probabilities).max(-1)
        correct = (predicted.numpy() == labels).astype(np.float32)
        gap = abs(confidence.detach().numpy().mean() - correct.mean())
        print(f"epoch {epoch}: calibration gap {gap:.3f}", flush=True)


def main() -> None:
    keras.utils.set_random_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = keras.Sequential(
        [
            keras.Input((SEQ,), dtype="int32"),
            keras.layers.Embedding(VOCAB, DIM),
            keras.layers.Dense(HIDDEN, activation="gelu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    words, labels = make_rows(TRAIN_ROWS, seed=0)
    model.fit(
        words,
        labels,
        batch_size=BATCH,
        epochs=2,
        verbose=2,
        callbacks=[Calibration(make_rows(HELD_ROWS, seed=1))],
    )
    print("fit finished")


if __name__ == "__main__":
    main()
