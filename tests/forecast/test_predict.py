"""Forecasts from per-step peaks: the crossing step, its interval, and when there is none."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from memdoc.forecast import Forecast, NoForecast, StepSeries, assess, forecast
from memdoc.forecast.model import (
    BEYOND_REACH,
    ENDS_FIRST,
    FIRST_EPOCH,
    NO_GROWTH,
    NO_LIMIT,
    TOO_FEW_STEPS,
)
from memdoc.forecast.predict import analyse
from memdoc.trace import load_trace

MiB = 1 << 20


def series(peaks: list[float], *, limit: float = 1000 * MiB, dt: float = 0.5) -> StepSeries:
    steps = list(range(1, len(peaks) + 1))
    return StepSeries(
        metric="torch.reserved",
        limit_bytes=limit,
        limit_label="GPU 0 total",
        steps=steps,
        times_s=[2.0 + dt * s for s in steps],
        peak_bytes=peaks,
        device=0,
    )


def leak(n: int, *, start: float = 200 * MiB, per_step: float = 4 * MiB, noise: float = 0.0):
    rng = random.Random(3)
    return [start + per_step * i + rng.gauss(0, noise) for i in range(n)]


def test_a_steady_leak_is_forecast_to_cross_at_the_right_step_and_time() -> None:
    result = analyse(series(leak(60, noise=2 * MiB)))
    assert isinstance(result, Forecast)
    # 200 MiB + 4 MiB × (step - 1) reaches 1000 MiB at step 201.
    assert result.oom_step == pytest.approx(201, abs=4)
    assert result.oom_step_early <= 201 <= result.oom_step_late
    assert result.seconds_per_step == pytest.approx(0.5)
    assert result.eta_s == pytest.approx((result.oom_step - 60) * 0.5)
    assert result.limit_label == "GPU 0 total"


def test_a_loop_planned_to_end_before_the_limit_gets_no_forecast() -> None:
    # 200 MiB + 4 MiB a step reaches 1000 MiB at about step 201 (190 at the earliest).
    steady = series(leak(60, noise=2 * MiB))

    ends_first = analyse(dataclasses.replace(steady, planned_end_step=150))
    ends_later = analyse(dataclasses.replace(steady, planned_end_step=250))
    ran_past_its_plan = analyse(dataclasses.replace(steady, planned_end_step=40))

    assert isinstance(ends_first, NoForecast) and ends_first.reason == ENDS_FIRST
    assert ends_first.detail.startswith("the loop ends at step 150, before the limit (step ")
    assert isinstance(ends_later, Forecast), "the limit comes before the planned end"
    assert isinstance(ran_past_its_plan, Forecast), "a plan already overrun says nothing"


def test_growth_in_a_first_epoch_waits_for_the_second_and_a_leak_that_goes_on_is_forecast() -> None:
    # 3 epochs of 50 steps; 200 MiB + 8 MiB a step reaches 1000 MiB at about step 101.
    epochs = {"loop_start_step": 0, "epoch_steps": 50, "planned_end_step": 150}
    cache = leak(50, per_step=8 * MiB, noise=1 * MiB)
    cache += [cache[-1] + random.Random(4).gauss(0, 1 * MiB) for _ in range(50)]
    filling = analyse(dataclasses.replace(series(cache[:45]), **epochs))
    second_epoch_begun = analyse(dataclasses.replace(series(cache[:55]), **epochs))
    full = analyse(dataclasses.replace(series(cache[:62]), **epochs))
    going_on = analyse(dataclasses.replace(series(leak(75, per_step=8 * MiB)), **epochs))
    # WITHOUT the loop's epochs, the same filling is forecast: the cap is in reach
    unknown = analyse(dataclasses.replace(series(cache[:45]), planned_end_step=150))
    # (and still 12 steps into the second epoch: the last third of the steps still grew)
    unknown_later = analyse(dataclasses.replace(series(cache[:62]), planned_end_step=150))

    assert isinstance(filling, NoForecast) and filling.reason == FIRST_EPOCH, filling
    assert filling.detail.startswith("growth in the loop's first epoch only so far (it ends at")
    assert isinstance(second_epoch_begun, NoForecast) and second_epoch_begun.reason == FIRST_EPOCH
    assert isinstance(full, NoForecast) and full.reason == NO_GROWTH, full
    assert full.detail == "growth stopped: no growth in the epoch that began at step 51"
    assert isinstance(going_on, Forecast) and going_on.oom_step == pytest.approx(101, abs=3)
    assert isinstance(unknown, Forecast) and isinstance(unknown_later, Forecast)


def test_a_second_epoch_with_steps_left_unread_is_waited_for_before_its_growth_is_judged() -> None:
    # The same filling first epoch, then 12 steps of the second of which a busy machine read
    # only 4 (samples come every interval): not enough of the second epoch to judge it.
    epochs = {"loop_start_step": 0, "epoch_steps": 50, "planned_end_step": 150}
    cache = leak(50, per_step=8 * MiB, noise=1 * MiB)
    flat = cache[-1]
    read = list(range(1, 51)) + [51, 55, 59, 62]
    sparse = dataclasses.replace(
        series(cache + [flat] * 4),
        steps=read,
        times_s=[2.0 + 0.5 * s for s in read],
        **epochs,
    )

    said = analyse(sparse)

    assert isinstance(said, NoForecast) and said.reason == FIRST_EPOCH, said
    assert said.judged_at_step == 62 + 8  # eight more read steps of the second epoch


def test_a_first_epoch_that_reaches_the_limit_itself_is_forecast() -> None:
    # 200 MiB + 20 MiB a step crosses 1000 MiB at step 41, inside a first epoch of 50 steps.
    epochs = {"loop_start_step": 0, "epoch_steps": 50, "planned_end_step": 150}
    said = analyse(dataclasses.replace(series(leak(30, per_step=20 * MiB)), **epochs))
    assert isinstance(said, Forecast) and said.oom_step == pytest.approx(41, abs=2)
    # A loop of one epoch is judged as before: its growth can stop nowhere else.
    one = {"loop_start_step": None, "epoch_steps": None, "planned_end_step": 150}
    assert isinstance(
        analyse(dataclasses.replace(series(leak(30, per_step=8 * MiB)), **one)), Forecast
    )


def test_the_optimizer_jump_at_the_first_steps_is_not_taken_for_growth() -> None:
    flat = [300 * MiB] * 3 + [700 * MiB + (i % 3) * MiB for i in range(40)]
    result = analyse(series(flat))
    assert isinstance(result, NoForecast)
    assert result.reason == NO_GROWTH


def test_noise_around_a_flat_line_says_no_growth() -> None:
    rng = random.Random(11)
    result = analyse(series([500 * MiB + rng.gauss(0, 30 * MiB) for _ in range(80)]))
    assert isinstance(result, NoForecast)
    assert result.reason == NO_GROWTH
    assert "no growth" in result.detail


def test_too_few_steps_make_no_forecast() -> None:
    result = analyse(series(leak(5)))
    assert isinstance(result, NoForecast)
    assert result.reason == TOO_FEW_STEPS


def test_no_limit_makes_no_forecast() -> None:
    result = analyse(series(leak(30), limit=0))
    assert isinstance(result, NoForecast)
    assert result.reason == NO_LIMIT


def test_the_limit_crossed_first_wins() -> None:
    slow = series(leak(40, per_step=1 * MiB))
    fast = series(leak(40, per_step=8 * MiB), limit=2000 * MiB)
    best = forecast([slow, fast])
    assert best is not None
    assert best.oom_step == min(
        r.oom_step for r in (analyse(slow), analyse(fast)) if isinstance(r, Forecast)
    )


def test_forecast_returns_none_and_assess_says_why() -> None:
    flat = series([400 * MiB] * 50)
    assert forecast(flat) is None
    reason = assess(flat)
    assert isinstance(reason, NoForecast) and reason.reason == NO_GROWTH


def test_the_event_data_round_trips() -> None:
    result = analyse(series(leak(40)))
    assert isinstance(result, Forecast)
    assert Forecast.from_data({"state": "likely", **result.to_data()}) == result
    assert Forecast.from_data({"metric": "x"}) is None


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "rules" / "leak-across-steps"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("hit-allocated-grows.memdoc", "GPU 0 total", id="gpu-allocated-grows"),
        pytest.param("hit-host-rss-grows.memdoc", "host RAM", id="host-rss-grows"),
        pytest.param("miss-flat-with-noise.memdoc", NO_GROWTH, id="flat-with-noise"),
        pytest.param("miss-one-jump-mid-run.memdoc", NO_GROWTH, id="one-jump-mid-run"),
        pytest.param("miss-warmup-then-plateau.memdoc", TOO_FEW_STEPS, id="warmup-plateau"),
    ],
)
def test_the_leak_rule_fixtures_forecast_where_memory_grows(name: str, expected: str) -> None:
    result = assess(load_trace(FIXTURES / name))
    if isinstance(result, Forecast):
        assert result.limit_label == expected
        assert result.growth_bytes_per_step > 0
    else:
        assert result is not None and result.reason == expected


def test_a_slow_drift_is_not_followed_to_a_limit_far_past_what_was_measured() -> None:
    GiB = 1 << 30
    # 20 KiB a step over 500 steps: 24 GiB of RAM is about a million steps away.
    drift = analyse(series(leak(500, start=GiB // 4, per_step=20 * 1024), limit=24 * GiB))
    assert isinstance(drift, NoForecast) and drift.reason == BEYOND_REACH
    assert "more than 200 times the" in drift.detail
    # 40 MiB a step over 20 steps: 64 GiB is about 90 times further: still forecast.
    steady = analyse(series(leak(20, start=1 * GiB, per_step=40 * MiB), limit=64 * GiB))
    assert isinstance(steady, Forecast)


def test_a_handful_of_rising_points_makes_no_forecast_yet() -> None:
    few = analyse(series(leak(9)))  # one warm-up point, then eight
    assert isinstance(few, NoForecast) and few.reason == TOO_FEW_STEPS
