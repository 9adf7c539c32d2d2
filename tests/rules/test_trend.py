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
