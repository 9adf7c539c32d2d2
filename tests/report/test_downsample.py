"""Min/max downsampling: fewer points, and never a lost peak."""

from __future__ import annotations

import bisect
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdoc.report.downsample import minmax_downsample


def _buckets(times: list[float], buckets: int) -> list[tuple[int, int]]:
    """Index ranges of `buckets` equal-width time buckets, as the docstring promises."""
    t0, t1 = times[0], times[-1]
    width = (t1 - t0) / buckets
    edges = (
        [0] + [bisect.bisect_left(times, t0 + b * width) for b in range(1, buckets)] + [len(times)]
    )
    return list(zip(edges, edges[1:], strict=False))


series = st.lists(
    st.tuples(st.floats(0.001, 10.0), st.floats(0, 2**40, allow_nan=False)),
    min_size=1,
    max_size=400,
)


@settings(max_examples=150, deadline=None)
@given(series, st.integers(2, 60))
def test_every_time_bucket_keeps_its_highest_and_lowest_value(
    points: list[tuple[float, float]], max_points: int
) -> None:
    times = list(itertools.accumulate(gap for gap, _ in points))
    values = [value for _, value in points]

    out_t, out_v = minmax_downsample(times, values, max_points)

    kept = list(zip(out_t, out_v, strict=True))
    assert len(kept) <= max(max_points, 1)
    assert out_t == sorted(out_t), "points stay in time order"
    assert set(kept) <= set(zip(times, values, strict=True)), "no invented points"
    if len(values) <= max_points:
        assert (out_t, out_v) == (times, values)
        return
    for start, end in _buckets(times, max_points // 2):
        if end > start:
            inside = {v for t, v in kept if times[start] <= t <= times[end - 1]}
            assert max(values[start:end]) in inside
            assert min(values[start:end]) in inside


def test_a_single_spike_among_a_million_samples_survives_with_its_time() -> None:
    times = [i * 0.01 for i in range(1_000_000)]
    values = [1.0] * len(times)
    values[654_321] = 99.0

    out_t, out_v = minmax_downsample(times, values, 2000)

    assert len(out_v) <= 2000
    assert (times[654_321], 99.0) in set(zip(out_t, out_v, strict=True))


@pytest.mark.parametrize(
    ("times", "values", "max_points", "error"),
    [
        pytest.param([0.0, 1.0], [1.0], 10, "differ in length", id="mismatched lengths"),
        pytest.param([0.0], [1.0], 1, "at least 2", id="too few points allowed"),
    ],
)
def test_bad_arguments_are_refused(
    times: list[float], values: list[float], max_points: int, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        minmax_downsample(times, values, max_points)
