"""Fit a wide-and-deep click model with Keras (torch backend) and Adam, whose two moments
per weight leave no room for the first step beside its hashed cross-feature table.

The model hashes pairs of categorical features into a table of 2^21 buckets of 24 floats
(192 MiB) and adds a small MLP over numeric features. With plain SGD the weights, a step's
gradient (dense for the table, another 192 MiB) and the update fit, and the fit trains
under the same cap. Adam keeps two moments the size of every weight, 384 MiB for the table
alone, which `fit` creates when it builds the optimizer, just before the first step: they
are allocated, and then the first step's backward pass runs out allocating the table's
gradient in the room they took. (Train with SGD, or a smaller table, or an optimizer whose
state is not a full copy of the table.)
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import torch

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
BUCKETS, DIM, CROSSES, NUMERIC, ROWS, BATCH = 1 << 21, 24, 16, 13, 65536, 1024


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_rows(rng: np.random.Generator, count: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Stands in for hashed impression logs: some crosses and one numeric feature click."""
    crosses = rng.integers(0, BUCKETS, (count, CROSSES)).astype(np.int32)
    numeric = rng.standard_normal((count, NUMERIC)).astype(np.float32)
    score = 2.0 * (crosses[:, 0] % 5 == 0) + numeric[:, 0] - 1.5
    clicked = (rng.random(count) < 1 / (1 + np.exp(-score))).astype(np.float32)
    return {"crosses": crosses, "numeric": numeric}, clicked


def build_model() -> keras.Model:
    crosses = keras.Input((CROSSES,), dtype="int32", name="crosses")
    numeric = keras.Input((NUMERIC,), name="numeric")
    wide = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(BUCKETS, DIM)(crosses))
    deep = keras.layers.Dense(64, activation="relu")(numeric)
    joined = keras.layers.Concatenate()([wide, deep])
    hidden = keras.layers.Dense(64, activation="relu")(joined)
    return keras.Model([crosses, numeric], keras.layers.Dense(1)(hidden))


def main() -> None:
    keras.utils.set_random_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    features, clicked = make_rows(np.random.default_rng(0), ROWS)
    model = build_model()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),  # BUG: 384 MiB of moments (SGD keeps none)
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.AUC(from_logits=True)],
    )
    model.fit(features, clicked, batch_size=BATCH, epochs=2, verbose=2)
    print("fit finished")


if __name__ == "__main__":
    main()
