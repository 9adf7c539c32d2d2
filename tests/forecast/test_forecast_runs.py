"""Forecasts for real leaking programs under a memory cap, checked against the real OOM."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.forecast import Forecast, NoForecast, assess
from memdoc.forecast.model import NO_GROWTH
from memdoc.forecast.words import forecast_words
from memdoc.trace import load_trace
from memdoc.trace.model import EventKind
from tests.forecast.runs import leak_run, memdoc_run, plain_run

pytest.importorskip("torch")

# The forecast made at 30% of the run must name the step that really ran out within 15%.
SHARE = 0.3
TOLERANCE = 0.15


def test_torch_leak_forecast_at_30_percent_names_the_oom_step(tmp_path: Path) -> None:
    run = leak_run(tmp_path, "torch_leak.py", "3", "400", "0.04")
    said = run.forecast_at(SHARE)
    assert said is not None
    assert abs(said.oom_step - run.oom_step) <= TOLERANCE * run.oom_step, (said, run.oom_step)
    assert said.limit_label == "address-space cap (RLIMIT_AS)"


def test_torch_leak_run_writes_the_forecast_live_and_the_summary_says_it(tmp_path: Path) -> None:
    # 2 MiB a step: the OOM comes near step 140, and the forecast, which needs about twenty
    # points, near step 45 (at 3 MiB a step a loaded machine put it at exactly half).
    run = leak_run(tmp_path, "torch_leak.py", "2", "400", "0.04")
    events = [e for e in run.trace.events(EventKind.FORECAST) if e.data["state"] == "likely"]
    assert events, "no forecast event during the run"
    first = Forecast.from_data(events[0].data)
    assert first is not None
    assert first.step < 0.5 * run.oom_step  # said well before the end
    assert abs(first.oom_step - run.oom_step) <= TOLERANCE * run.oom_step
    assert f"forecast at step {first.step:,}:" in run.stderr


def test_jax_leak_forecast_at_30_percent_names_the_oom_step(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    run = leak_run(tmp_path, "jax_leak.py", "8", "1200", "0.03")
    said = run.forecast_at(SHARE)
    assert said is not None
    assert abs(said.oom_step - run.oom_step) <= TOLERANCE * run.oom_step, (said, run.oom_step)


def test_tensorflow_leak_forecast_at_30_percent_names_the_oom_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    run = leak_run(tmp_path, "tf_leak.py", "2", "400")
    said = run.forecast_at(SHARE)
    assert said is not None
    assert abs(said.oom_step - run.oom_step) <= TOLERANCE * run.oom_step, (said, run.oom_step)
    assert said.limit_label == "TensorFlow host allocator limit"


def test_a_run_without_growth_says_no_growth_and_its_summary_stays_quiet(tmp_path: Path) -> None:
    done = memdoc_run(tmp_path, "torch_batch.py", "32", "320", "200")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "forecast" not in done.stderr
    trace = load_trace(tmp_path / "torch_batch.memdoc")
    assert trace.events(EventKind.FORECAST) == []
    said = assess(trace)
    assert isinstance(said, NoForecast) and said.reason == NO_GROWTH
    assert forecast_words(said).startswith("OOM forecast: no growth over")


def test_a_watch_session_writes_the_forecast_before_the_oom(tmp_path: Path) -> None:
    trace_path = tmp_path / "watch.memdoc"
    done = plain_run("watch_leak.py", str(trace_path), "200")
    assert "MemoryError" in done.stderr, done.stderr[-2000:]
    trace = load_trace(trace_path)
    oom_step = len(trace.steps()) + 1
    events = [e for e in trace.events(EventKind.FORECAST) if e.data["state"] == "likely"]
    assert events, "no forecast event during the watch block"
    first = Forecast.from_data(events[0].data)
    assert first is not None and first.step < oom_step
    assert abs(first.oom_step - oom_step) <= TOLERANCE * oom_step
