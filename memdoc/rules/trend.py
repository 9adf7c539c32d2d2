"""Trends of a memory value over steps: fitted and robust slopes, growth, and steadiness."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Trend:
    """A straight line fitted through per-step values, and how steadily they rise."""

    steps: int  # values fitted
    slope_per_step: float  # least squares, bytes per step
    start: float  # fitted value at the first step
    growth: float  # fitted growth over the window, bytes
    relative_growth: float  # growth / fitted start
    monotonic_fraction: float  # share of changes between values that do not go down
    residual_fraction: float  # typical distance from the line, relative to the growth
    # The median rise per step between each value and the one half the window later: a
    # warm-up jump followed by a plateau gives ~0 here, where least squares sees growth.
    robust_slope_per_step: float = 0.0
    rising_fraction: float = 0.0  # share of changes between values that go up (beyond tolerance)
    span_steps: float = 0.0  # steps from the first value to the last

    @property
    def robust_growth(self) -> float:
        """Growth over the window at the robust slope, bytes."""
        return self.robust_slope_per_step * self.span_steps


def fit_trend(
    values: Sequence[float],
    *,
    tolerance: float = 0.0,
    positions: Sequence[float] | None = None,
) -> Trend | None:
    """Fit a line through `values`; None with fewer than two values.

    `positions` are the step numbers the values were read at (increasing), when not one per
    step. A change between values counts as "not down" when it drops by no more than
    `tolerance` bytes, and as "up" when it rises by more, so sampling jitter is neither growth
    nor loss.
    """
    n = len(values)
    xs = [float(i) for i in range(n)] if positions is None else [float(x) for x in positions]
    if n < 2 or len(xs) != n or xs[-1] <= xs[0]:
        return None
    mean_x = sum(xs) / n
    mean_y = sum(values) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (v - mean_y) for x, v in zip(xs, values, strict=True))
    slope = sxy / sxx
    start = mean_y - slope * (mean_x - xs[0])
    span = xs[-1] - xs[0]
    growth = slope * span
    changes = [b - a for a, b in itertools.pairwise(values)]
    residual = sum(abs(v - (start + slope * (x - xs[0]))) for x, v in zip(xs, values, strict=True))
    return Trend(
        steps=n,
        slope_per_step=slope,
        start=start,
        growth=growth,
        relative_growth=growth / start if start > 0 else float("inf") if growth > 0 else 0.0,
        monotonic_fraction=sum(1 for c in changes if c >= -tolerance) / (n - 1),
        residual_fraction=residual / n / abs(growth) if growth else float("inf"),
        robust_slope_per_step=half_window_slope(values, xs),
        rising_fraction=sum(1 for c in changes if c > tolerance) / (n - 1),
        span_steps=span,
    )


def half_window_slope(values: Sequence[float], positions: Sequence[float]) -> float:
    """Median of the slopes from each value to the one half the window later: linear in the
    number of values.

    A jump in the first or last steps enters few of these slopes, so it barely moves the
    median; a jump in the middle enters all of them, which `rising_fraction` tells apart
    from growth that lasts.
    """
    n = len(values)
    half = math.ceil(n / 2)
    slopes = [
        (values[i + half] - values[i]) / (positions[i + half] - positions[i])
        for i in range(n - half)
        if positions[i + half] > positions[i]
    ]
    return statistics.median(slopes) if slopes else 0.0
