"""The robust line, its interval and the warm-up, on series with a known answer."""

from __future__ import annotations

import random

import pytest

from memdoc.forecast.fit import MAX_FIT_POINTS, theil_sen, thin, warmup_points

MiB = 1 << 20


def test_theil_sen_recovers_a_line_despite_outliers() -> None:
    xs = [float(i) for i in range(40)]
    ys = [100 * MiB + 3 * MiB * x for x in xs]
    ys[7] += 500 * MiB  # one wild peak (a checkpoint save)
    ys[30] -= 80 * MiB
    fit = theil_sen(xs, ys)
    assert fit is not None
    assert fit.slope == pytest.approx(3 * MiB, rel=1e-6)
    assert fit.intercept == pytest.approx(100 * MiB, rel=1e-6)


def test_the_slope_interval_brackets_the_true_slope_of_noisy_data() -> None:
    rng = random.Random(7)
    xs = [float(i) for i in range(60)]
    ys = [1000 * MiB + 2 * MiB * x + rng.gauss(0, 8 * MiB) for x in xs]
    fit = theil_sen(xs, ys)
    assert fit is not None
    assert fit.slope_low < 2 * MiB < fit.slope_high
    assert fit.slope_low > 0  # 2 MiB a step stands out of 8 MiB of scatter over 60 steps


def test_a_fit_needs_three_distinct_steps() -> None:
    assert theil_sen([1.0, 2.0], [1.0, 2.0]) is None


def test_thinning_bounds_the_work_and_keeps_both_ends() -> None:
    xs = list(range(1000))
    fx, fy = thin(xs, xs, MAX_FIT_POINTS)
    assert len(fx) == MAX_FIT_POINTS
    assert (fx[0], fx[-1]) == (0, 999)


@pytest.mark.parametrize(
    ("ys", "expected"),
    [
        pytest.param([50, 900, 901, 902, 903, 904, 905, 906, 907, 908, 909], 1, id="program-start"),
        pytest.param(
            [50, 100, 101, 700, 701, 702, 703, 704, 705, 706, 707, 708, 709, 710], 3, id="jump"
        ),
        pytest.param([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], 1, id="steady-growth"),
    ],
)
def test_warmup_skips_the_start_and_a_leading_jump_but_not_growth(
    ys: list[float], expected: int
) -> None:
    assert warmup_points([y * MiB for y in ys]) == expected


def test_a_jump_late_in_the_run_is_not_warmup() -> None:
    ys = [100 + i for i in range(30)] + [900 + i for i in range(10)]
    assert warmup_points([y * MiB for y in ys]) == 1
