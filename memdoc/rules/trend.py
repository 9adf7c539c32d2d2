"""Trends of a memory value over steps: least-squares slope, growth and monotonicity."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Trend:
    """A straight line fitted through per-step values."""

    steps: int
    slope_per_step: float  # bytes per step
    start: float  # fitted value at the first step
    growth: float  # fitted growth over the window, bytes
    relative_growth: float  # growth / fitted start
    monotonic_fraction: float  # share of step-to-step changes that do not go down
    residual_fraction: float  # typical distance from the line, relative to the growth


def fit_trend(values: Sequence[float], *, tolerance: float = 0.0) -> Trend | None:
    """Fit a line through `values` (one per step); None with fewer than two values.

    A step-to-step change counts as "not down" when it drops by no more than `tolerance`
    bytes, so sampling jitter does not break monotonicity.
    """
    n = len(values)
    if n < 2:
        return None
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    sxy = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    slope = sxy / sxx
    start = mean_y - slope * mean_x
    growth = slope * (n - 1)
    rises = sum(1 for a, b in itertools.pairwise(values) if b - a >= -tolerance)
    residual = sum(abs(v - (start + slope * i)) for i, v in enumerate(values)) / n
    return Trend(
        steps=n,
        slope_per_step=slope,
        start=start,
        growth=growth,
        relative_growth=growth / start if start > 0 else float("inf") if growth > 0 else 0.0,
        monotonic_fraction=rises / (n - 1),
        residual_fraction=residual / abs(growth) if growth else float("inf"),
    )
