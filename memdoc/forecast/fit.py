"""Robust line fits over step-boundary peaks: Theil–Sen with Sen's interval, and warm-up."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided normal quantile for the 90% interval of Sen's slope.
Z_90 = 1.6449
# At most this many points enter a fit: Theil–Sen costs n²/2 pairwise slopes.
MAX_FIT_POINTS = 80
# The warm-up is looked for in this leading share of the points, and never beyond
# MAX_WARMUP_POINTS of them.
WARMUP_SHARE = 0.3
MAX_WARMUP_POINTS = 30


@dataclass(frozen=True)
class LineFit:
    """A robust straight line y = intercept + slope·x, with the 90% interval of the slope."""

    slope: float
    intercept: float
    slope_low: float
    slope_high: float
    points: int
    residual_spread: float  # 1.4826 × median absolute residual: a robust standard deviation

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x

    def intercept_for(self, slope: float, xs: Sequence[float], ys: Sequence[float]) -> float:
        """The median intercept of the data for another slope (the interval's ends)."""
        return statistics.median(y - slope * x for x, y in zip(xs, ys, strict=True))


def thin(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], ...]:
    """Evenly spaced points, the first and the last always kept."""
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    picks = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
    return [xs[i] for i in picks], [ys[i] for i in picks]


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> LineFit | None:
    """Theil–Sen line (median of pairwise slopes) with Sen's 90% slope interval.

    The interval comes from the distribution of Kendall's S under no trend (Sen 1968):
    it needs no bootstrap, and a handful of outliers or a jump moves it little. None with
    fewer than three distinct x values.
    """
    fx, fy = thin(xs, ys, MAX_FIT_POINTS)
    n = len(fx)
    slopes = sorted(
        (fy[j] - fy[i]) / (fx[j] - fx[i])
        for i in range(n)
        for j in range(i + 1, n)
        if fx[j] != fx[i]
    )
    if len(slopes) < 3:
        return None
    slope = statistics.median(slopes)
    intercept = statistics.median(y - slope * x for x, y in zip(fx, fy, strict=True))
    count = len(slopes)
    c = Z_90 * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low_rank = max(0, math.floor((count - c) / 2) - 1)
    high_rank = min(count - 1, math.ceil((count + c) / 2))
    residuals = [abs(y - intercept - slope * x) for x, y in zip(fx, fy, strict=True)]
    return LineFit(
        slope=slope,
        intercept=intercept,
        slope_low=slopes[low_rank],
        slope_high=slopes[high_rank],
        points=n,
        residual_spread=1.4826 * statistics.median(residuals),
    )


def warmup_points(ys: Sequence[float]) -> int:
    """How many leading points are warm-up, not trend.

    The first point always is (its window holds the program's start). After it, a rise
    that stands far out from the typical step-to-step change, in the leading part of the
    run, is a one-off (optimizer state created at the first step, a compile): everything
    up to it is skipped.
    """
    n = len(ys)
    if n < 4:
        return min(n, 1)
    changes = [b - a for a, b in itertools.pairwise(ys[1:])]
    typical = statistics.median(changes)
    spread = 1.4826 * statistics.median(abs(c - typical) for c in changes)
    level = statistics.median(abs(y) for y in ys)
    threshold = typical + max(6 * spread, 0.02 * level)
    search = min(MAX_WARMUP_POINTS, max(2, int(n * WARMUP_SHARE)))
    skip = 1
    for i, change in enumerate(changes[: search - 1]):
        if change > threshold:
            skip = i + 2  # the point after the jump is the first of the trend
    return skip
