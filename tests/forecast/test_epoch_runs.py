"""A Keras `fit` says its epochs: memory that fills once in the first epoch (a dataset cached
in memory) is no leak, and a leak that goes on into the second epoch is still forecast."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.forecast import NoForecast, assess
from memdoc.forecast.model import NO_GROWTH
from memdoc.trace import load_trace
from memdoc.trace.model import EventKind
from tests.forecast.runs import memdoc_run

pytest.importorskip("tensorflow")

LIMIT_MB = "200"  # the TensorFlow host allocator's cap
# Steps of a few dozen milliseconds: a sample at almost every step.
OPTIONS = ("--interval", "0.02")


def test_a_dataset_cached_in_the_first_epoch_is_never_forecast_to_run_out(tmp_path: Path) -> None:
    # GIVEN 3 epochs of 60 steps whose pipeline caches 2 MiB of decoded examples a step: at
    # that rate the 200 MiB cap comes at about step 85, and the cache is full at step 60
    # (about 135 MiB in all)
    done = memdoc_run(tmp_path, "keras_cache.py", "cache", LIMIT_MB, options=OPTIONS)
    assert done.returncode == 0, done.stderr[-2000:]
    trace = load_trace(tmp_path / "keras_cache.memdoc")
    # THEN no forecast was made while it ran (without the epochs: "likely" in the first one)
    assert [e.data["state"] for e in trace.events(EventKind.FORECAST)] == []
    # AND read again after the run, the growth stopped
    said = assess(trace)
    assert isinstance(said, NoForecast) and said.reason == NO_GROWTH, said
    assert "forecast" not in done.stderr


def test_a_leak_that_goes_on_into_the_second_epoch_is_forecast_before_it_runs_out(
    tmp_path: Path,
) -> None:
    # GIVEN the same fit without the cache, and a callback that keeps 2 MiB every batch
    done = memdoc_run(tmp_path, "keras_cache.py", "leak", LIMIT_MB, options=OPTIONS)
    assert done.returncode != 0
    trace = load_trace(tmp_path / "keras_cache.memdoc")
    oom = trace.ending_oom()
    assert oom is not None, done.stderr[-2000:]
    # THEN once the second epoch grew too, the forecast said the cap was in reach, in time
    said = [e for e in trace.events(EventKind.FORECAST) if e.data["state"] == "likely"]
    assert said, done.stderr[-2000:]
    assert 60 < said[0].data["step"] < len(trace.steps())
    assert said[0].data["metric"] == "tf.allocated"
