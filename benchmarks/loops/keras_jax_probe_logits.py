"""Fit a Keras product classifier (JAX backend) with a callback that follows a fixed probe
batch through training.

To plot how the predictions on 1024 probe examples evolve, the callback runs the model on
them after every training batch and appends the logits (1024 x 4000 categories, 16 MiB)
to a list that is only read at the end. Memory grows by one probe's logits a step, and
the fit runs out after a few dozen steps of its first epoch. (Keep the few numbers the
plot needs, such as the mean probability of the true class, as Python floats.)
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
FEATURES, HIDDEN, CATEGORIES, ROWS, BATCH, PROBE = 64, 128, 4000, 32768, 128, 1024


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class ProbeTrajectory(keras.callbacks.Callback):
    """Keeps the probe batch's logits after every training batch, for a plot at the end."""

    def __init__(self, probe: tuple[np.ndarray, np.ndarray]) -> None:
        super().__init__()
        self.probe_x, self.probe_y = probe
        self.logits: list[jax.Array] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # BUG: keeps the full logits of every step (keep a float per step instead)
        self.logits.append(self.model(self.probe_x, training=False))

    def on_train_end(self, logs: dict | None = None) -> None:
        rows = jnp.arange(len(self.probe_y))
        for step, logits in enumerate(self.logits, start=1):
            true_class = jax.nn.softmax(logits)[rows, self.probe_y].mean()
            print(f"step {step}: probe p(true) {float(true_class):.4f}")


def make_rows(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for product embeddings: each category has its own centre."""
    centers = np.random.default_rng(1).standard_normal((CATEGORIES, FEATURES))
    labels = rng.integers(0, CATEGORIES, count)
    features = centers[labels] + 0.5 * rng.standard_normal((count, FEATURES))
    return features.astype(np.float32), labels


def main() -> None:
    keras.utils.set_random_seed(0)
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    features, labels = make_rows(rng, ROWS)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(CATEGORIES),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        features,
        labels,
        batch_size=BATCH,
        epochs=1,
        verbose=2,
        callbacks=[ProbeTrajectory(make_rows(rng, PROBE))],
    )
    print("fit finished")


if __name__ == "__main__":
    main()
