"""Growth that stops is not a leak: real programs whose memory levels off, and the summary
of runs that ended well."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.forecast import Forecast, NoForecast, assess
from memdoc.forecast.model import BEYOND_REACH, NO_GROWTH
from memdoc.forecast.summary import applied_limit, forecast_in_force
from memdoc.trace import load_trace
from memdoc.trace.model import EventKind, Metric, OomInfo
from tests.forecast.runs import STEADY_MALLOC_ENV, memdoc_run

pytest.importorskip("torch")


def test_a_cache_that_fills_then_stays_flat_clears_the_forecast_and_the_summary_is_quiet(
    tmp_path: Path,
) -> None:
    # 3 MiB a step for 60 steps under a cap 400 MiB away, then flat for 140 steps: at the rate
    # of the filling the cap is near, and the program never gets there. With glibc's dynamic
    # mmap threshold the replaced 3 MiB tensors come from the heap after the first frees, and
    # its address space then drifts up by tens of MiB in the flat part, in plain runs too
    # (real growth, at 0.5 MiB a step, that memdoc rightly forecasts): the threshold is fixed.
    done = memdoc_run(tmp_path, "torch_plateau.py", "60", "200", "3", "400", env=STEADY_MALLOC_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    trace = load_trace(tmp_path / "torch_plateau.memdoc")
    states = [e.data["state"] for e in trace.events(EventKind.FORECAST)]
    assert "likely" in states  # while the cache filled, the cap was in reach
    assert states[-1] == "cleared"  # once it was full, no longer
    assert forecast_in_force(trace, trace.last_t) is None
    said = assess(trace)
    assert isinstance(said, NoForecast) and said.reason in (NO_GROWTH, BEYOND_REACH), said
    assert "forecast" not in done.stderr  # the summary of a run that ended well says nothing


def test_a_short_clean_run_says_nothing_of_a_limit_far_beyond_its_length(tmp_path: Path) -> None:
    # Memory grows at every one of 14 steps, no cap: host RAM is thousands of steps away.
    done = memdoc_run(tmp_path, "torch_plateau.py", "1000", "14", "3", "0", "0.12")
    assert done.returncode == 0, done.stderr[-2000:]
    said = assess(load_trace(tmp_path / "torch_plateau.memdoc"))
    # The growth is real, and the RAM hundreds of times further away than the run measured.
    assert isinstance(said, NoForecast) and said.reason == BEYOND_REACH, said
    assert "forecast" not in done.stderr


def test_after_an_oom_the_summary_speaks_of_the_limit_that_ran_out() -> None:
    capped = applied_limit(
        OomInfo(framework="pytorch", kind="host-alloc", device_type="cpu"),
        {"rlimit_as_bytes": 1 << 30, "address_space_bytes": 1 << 30},
    )
    assert capped is not None
    assert capped(_said(Metric.HOST_VMS)) and not capped(_said(Metric.HOST_RSS))
    gpu = applied_limit(OomInfo(framework="pytorch", device=1, device_type="gpu"), None)
    assert gpu is not None
    assert gpu(_said("torch.reserved", device=1))
    assert not gpu(_said("torch.reserved", device=0)) and not gpu(_said(Metric.HOST_RSS))
    bfc = applied_limit(OomInfo(framework="tensorflow", device_type="cpu"), None)
    assert bfc is not None and bfc(_said("tf.allocated", device=-1))
    assert not bfc(_said(Metric.HOST_VMS))


def _said(metric: str, device: int | None = None) -> Forecast:
    return Forecast(
        metric=metric,
        limit_label="",
        limit_bytes=1 << 30,
        t_s=1.0,
        step=10,
        current_bytes=1 << 29,
        growth_bytes_per_step=1.0,
        growth_low_bytes_per_step=1.0,
        growth_high_bytes_per_step=1.0,
        oom_step=20,
        oom_step_early=20,
        oom_step_late=20,
        eta_s=None,
        eta_early_s=None,
        eta_late_s=None,
        seconds_per_step=None,
        warmup_steps=1,
        points=9,
        device=device,
    )
