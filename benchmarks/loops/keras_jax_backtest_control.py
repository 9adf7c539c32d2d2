"""Fit a day-ahead electricity-load forecaster with Keras (JAX backend) and back-test it at
the end of every epoch on a year of held-out windows: a run with no memory problem, whose
memory jumps at each epoch's end.

Each example is a week of hourly readings (168 hours x 6 channels: load, temperature,
humidity, hour and day encodings) and the target the next 24 hours of load. The model is
two 1D convolutions of 32 filters over the week, pooled, and a dense head; it trains on
4096 windows in batches of 256, where a step's feature maps are a few MiB. At the end of
every epoch a callback back-tests it: `model.predict` over 16,384 held-out windows in
batches of 4096, where each convolution's output is 84 MiB (with the predict function's
other temporaries, a few hundred MiB at once), then a mean absolute percentage error over the
(16384, 24) forecasts. Memory jumps at each epoch's end and falls
back when the back-test is done; nothing is kept from one back-test to the next but a list
of four numbers, it all fits within the cap, and the fit finishes.
"""

from __future__ import annotations

import os
import resource

os.environ["KERAS_BACKEND"] = "jax"

import jax
import jax.numpy as jnp
import keras
import numpy as np

BUDGET_BYTES = 2304 << 20  # as on a machine with 2.25 GiB to spare
HOURS, CHANNELS, HORIZON, FILTERS = 168, 6, 24, 32
WINDOWS, HELD_OUT, BATCH, BACKTEST_BATCH, EPOCHS = 4096, 16_384, 256, 4096, 4


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_windows(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for metered load: a daily and a weekly cycle, scaled by the temperature."""
    start = rng.integers(0, 24 * 365, count)[:, None]
    hours = start + np.arange(HOURS + HORIZON)[None, :]
    temperature = 12 + 10 * np.sin(2 * np.pi * hours / (24 * 365)) + rng.normal(0, 2, hours.shape)
    load = (
        100
        + 30 * np.sin(2 * np.pi * hours / 24)
        + 10 * np.sin(2 * np.pi * hours / (24 * 7))
        + 1.5 * np.abs(temperature - 18)
        + rng.normal(0, 3, hours.shape)
    )
    past = slice(0, HOURS)
    inputs = np.stack(
        [
            load[:, past] / 100,
            temperature[:, past] / 20,
            rng.uniform(0.3, 0.9, (count, HOURS)),
            np.sin(2 * np.pi * hours[:, past] / 24),
            np.cos(2 * np.pi * hours[:, past] / 24),
            np.sin(2 * np.pi * hours[:, past] / (24 * 7)),
        ],
        axis=-1,
    ).astype(np.float32)
    return inputs, (load[:, HOURS:] / 100).astype(np.float32)


class Backtest(keras.callbacks.Callback):
    """At each epoch's end, forecast a year of held-out windows and report the MAPE."""

    def __init__(self, inputs: np.ndarray, targets: np.ndarray) -> None:
        super().__init__()
        self.inputs, self.targets = inputs, targets
        self.history: list[float] = []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        forecasts = self.model.predict(self.inputs, batch_size=BACKTEST_BATCH, verbose=0)
        mape = float(np.mean(np.abs(forecasts - self.targets) / self.targets)) * 100
        self.history.append(mape)
        print(f"epoch {epoch + 1}: back-test MAPE {mape:.2f}%", flush=True)


def make_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((HOURS, CHANNELS)),
            keras.layers.Conv1D(FILTERS, 5, padding="same", activation="relu"),
            keras.layers.Conv1D(FILTERS, 5, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(HORIZON),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mae")
    return model


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    inputs, targets = make_windows(WINDOWS, rng)
    held_inputs, held_targets = make_windows(HELD_OUT, rng)
    print(f"{WINDOWS} training windows, {inputs.nbytes >> 20} MiB", flush=True)
    model = make_model()
    model.fit(
        inputs,
        targets,
        batch_size=BATCH,
        epochs=EPOCHS,
        callbacks=[Backtest(held_inputs, held_targets)],
        verbose=2,
    )
    print("fit finished")


if __name__ == "__main__":
    main()
