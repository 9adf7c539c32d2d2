"""Fitting a line through per-step values: slope, growth, and how steadily it rises."""

from __future__ import annotations

import pytest

from memdoc.rules.trend import fit_trend


def test_a_steady_rise_is_fitted_exactly() -> None:
    trend = fit_trend([100.0, 110.0, 120.0, 130.0, 140.0])

    assert trend is not None
    assert trend.slope_per_step == pytest.approx(10.0)
    assert trend.growth == pytest.approx(40.0)
    assert trend.relative_growth == pytest.approx(0.4)
    assert trend.monotonic_fraction == 1.0
    assert trend.residual_fraction == pytest.approx(0.0)


def test_jitter_within_tolerance_still_counts_as_not_going_down() -> None:
    values = [100.0, 99.0, 103.0, 102.5, 106.0]

    assert fit_trend(values, tolerance=0.0).monotonic_fraction == 0.5  # type: ignore[union-attr]
    assert fit_trend(values, tolerance=1.0).monotonic_fraction == 1.0  # type: ignore[union-attr]


def test_a_flat_series_has_no_growth_and_one_value_no_trend() -> None:
    flat = fit_trend([5.0] * 6)

    assert flat is not None and flat.growth == 0.0 and flat.relative_growth == 0.0
    assert fit_trend([5.0]) is None


def test_a_warmup_jump_then_a_plateau_has_no_robust_growth() -> None:
    # Step baselines of a real CPU run (MiB): step 1 allocates once, then memory stays.
    trend = fit_trend([384.0, 519.0, 519.0, 519.0, 527.0, 527.0])

    assert trend is not None
    assert trend.growth > 100  # least squares reads the jump as growth
    assert trend.robust_growth < 15
    assert trend.rising_fraction == pytest.approx(0.4)


@pytest.mark.parametrize("steps", [5, 6, 12, 101], ids=lambda n: f"{n}-steps")
def test_a_steady_rise_has_the_same_robust_slope_whatever_the_number_of_steps(steps: int) -> None:
    trend = fit_trend([1000.0 + 7.0 * k for k in range(steps)])

    assert trend is not None
    assert trend.robust_slope_per_step == pytest.approx(7.0)
    assert trend.rising_fraction == 1.0


def test_one_jump_in_the_middle_rises_in_one_step_only() -> None:
    trend = fit_trend([40.0] * 6 + [46.0] * 6)

    assert trend is not None and trend.robust_slope_per_step > 0
    assert trend.rising_fraction == pytest.approx(1 / 11)


def test_values_read_every_few_steps_give_the_slope_per_step() -> None:
    trend = fit_trend([100.0, 130.0, 160.0, 190.0], positions=[0, 3, 6, 9])

    assert trend is not None
    assert trend.slope_per_step == pytest.approx(10.0)
    assert trend.robust_slope_per_step == pytest.approx(10.0)
    assert trend.span_steps == 9 and trend.robust_growth == pytest.approx(90.0)
