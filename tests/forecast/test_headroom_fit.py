"""Memory against batch size: the fitted terms and the largest size under the limit."""

from __future__ import annotations

import pytest

from memdoc.forecast.headroom import SizePeak, fit_headroom, nearest_pair

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


def test_the_two_largest_sizes_give_the_slope_near_the_limit() -> None:
    points = [SizePeak(8, 10.0), SizePeak(64, 30.0), SizePeak(16, 12.0)]
    assert [p.size for p in nearest_pair(points)] == [16, 64]
