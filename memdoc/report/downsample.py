"""Min/max downsampling of a time series that keeps every bucket's highest and lowest value."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

DEFAULT_MAX_POINTS = 2400  # about two points per pixel column of a wide plot


def minmax_downsample(
    times: Sequence[float], values: Sequence[float], max_points: int = DEFAULT_MAX_POINTS
) -> tuple[list[float], list[float]]:
    """At most `max_points` points: the min and the max of each of `max_points // 2` time buckets.

    Buckets split the time range evenly, so a burst of samples cannot crowd out a quiet
    stretch. Within a bucket the two points keep their time order, so a spike stays a spike
    and the global peak (always some bucket's max) is never lost.
    """
    if len(times) != len(values):
        raise ValueError("times and values differ in length")
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    if len(values) <= max_points:
        return list(times), list(values)
    buckets = max_points // 2
    t0, t1 = times[0], times[-1]
    width_s = (t1 - t0) / buckets
    out_t: list[float] = []
    out_v: list[float] = []
    start = 0
    for b in range(1, buckets + 1):
        end = len(values) if b == buckets else bisect.bisect_left(times, t0 + b * width_s, start)
        if end > start:
            for i in _extremes(values, start, end):
                out_t.append(times[i])
                out_v.append(values[i])
        start = end
    return out_t, out_v


def _extremes(values: Sequence[float], start: int, end: int) -> list[int]:
    """Indices of the lowest and highest value in values[start:end], in time order."""
    chunk = values[start:end]
    i_hi = start + chunk.index(max(chunk))
    i_lo = start + chunk.index(min(chunk))
    return sorted({i_lo, i_hi})
