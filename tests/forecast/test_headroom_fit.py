"""Memory against batch size: the fitted terms and the largest size under the limit."""

from __future__ import annotations

import pytest

from memdoc.forecast.headroom import SizePeak, fit_headroom

MiB = 1 << 20


def measured(fixed: float, per_sample: float, sizes: tuple[int, ...]) -> list[SizePeak]:
    return [SizePeak(s, fixed + per_sample * s) for s in sizes]


def test_fixed_and_per_sample_terms_are_recovered_and_the_answer_is_under_the_limit() -> None:
    fit = fit_headroom(measured(600 * MiB, 2 * MiB, (8, 16, 32)), 1000 * MiB, margin=0.0)
    assert fit is not None
    assert fit.fixed_bytes == pytest.approx(600 * MiB)
    assert fit.per_size_bytes == pytest.approx(2 * MiB)
    assert fit.largest_size == 200
    assert fit.predicted_bytes(200) == pytest.approx(1000 * MiB)
    assert fit.predicted_bytes(201) > 1000 * MiB
    assert fit.dominant == "fixed"  # 600 MiB fixed vs 400 MiB of activations at 200


def test_the_margin_and_the_multiple_round_the_answer_down() -> None:
    fit = fit_headroom(measured(100 * MiB, 4 * MiB, (8, 16)), 1000 * MiB, margin=0.1, multiple_of=8)
    assert fit is not None
    # (900 - 100) / 4 = 200, a multiple of 8 already; with 10% kept free.
    assert fit.largest_size == 200
    assert fit.dominant == "per-sample"


def test_a_size_known_to_run_out_bounds_the_answer() -> None:
    fit = fit_headroom(
        measured(100 * MiB, 4 * MiB, (8, 16)), 1000 * MiB, margin=0.0, multiple_of=8, below=160
    )
    assert fit is not None and fit.largest_size == 152


def test_nothing_fits_when_the_fixed_part_is_over_the_limit() -> None:
    fit = fit_headroom(measured(1100 * MiB, 1 * MiB, (8, 16)), 1000 * MiB, margin=0.0)
    assert fit is not None and fit.largest_size is None


def test_one_size_is_not_a_fit() -> None:
    assert fit_headroom([SizePeak(8, 1.0), SizePeak(8, 2.0)], 10.0, margin=0.0) is None


def test_a_peak_that_did_not_rise_with_its_size_leaves_the_slope_positive() -> None:
    # GIVEN 16 and 32 whose peaks came out equal (the allocator had room to spare at 16)
    points = measured(500 * MiB, 2 * MiB, (8, 64, 128)) + [SizePeak(16, 532 * MiB)]
    points.append(SizePeak(32, 532 * MiB))
    # WHEN the line is fitted through all five
    fit = fit_headroom(points, 1000 * MiB, margin=0.0)
    # THEN one flat pair does not flatten it: the slope stays near 2 MiB a unit
    assert fit is not None
    assert fit.per_size_bytes == pytest.approx(2 * MiB, rel=0.05)
    assert fit.largest_size is not None and 240 <= fit.largest_size <= 260
    # ... and its uncertainty shows: the interval of five points reaches a flat slope, which
    # puts no upper end on the range.
    assert fit.largest_low is not None and fit.largest_low < fit.largest_size
    assert fit.largest_high is None


def test_peaks_that_do_not_rise_find_no_limit_and_never_say_nothing_fits() -> None:
    # The user's case: three sizes trained, their peaks equal within noise.
    points = [SizePeak(8, 2.70e9), SizePeak(16, 2.69e9), SizePeak(32, 2.70e9)]
    fit = fit_headroom(points, 2.9e9, margin=0.05)
    assert fit is not None and fit.largest_size is None  # no limit found, not "nothing fits"


def test_a_straight_line_has_a_range_of_one_size() -> None:
    fit = fit_headroom(measured(100 * MiB, 4 * MiB, (8, 16, 32)), 1000 * MiB, margin=0.0)
    assert fit is not None
    assert (fit.largest_low, fit.largest_size, fit.largest_high) == (225, 225, 225)
