"""Forecast the step and time at which per-step peaks cross a limit."""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Sequence

from memdoc.forecast.fit import Z_90, LineFit, theil_sen, warmup_points
from memdoc.forecast.model import (
    BEYOND_REACH,
    ENDS_FIRST,
    FIRST_EPOCH,
    NO_GROWTH,
    NO_LIMIT,
    TOO_FEW_STEPS,
    Forecast,
    NoForecast,
    StepSeries,
)
from memdoc.units import format_bytes

# Fewer trend points than this (after the warm-up) make no forecast: a handful of points
# rising together is as often a program finding its shapes (compiles, buckets, caches
# warming) as a leak.
MIN_TREND_POINTS = 10
# A line is not followed further than this many times the steps it was fitted over: 20 KiB
# a step seen over 500 steps says nothing about a RAM a million steps away (2,000 times
# further), where 40 MiB a step over 18 steps does about one 90 times further.
MAX_EXTRAPOLATION = 200
# Growth over the fitted window must stand this many robust standard deviations above
# the scatter of the peaks, and be at least this share of their level: a flat line with
# noise on it is not a trend.
MIN_GROWTH_SPREADS = 3.0
MIN_GROWTH_SHARE = 0.01
# The pace of steps is read from this many recent points.
PACE_POINTS = 32
# Growth that levels off (a cache that is full, the optimizer's state after its first
# step, a warm allocator) is no trend: over the last share of the points (at least
# MIN_RECENT_POINTS) the upper end of the slope's interval must stay above this share of
# the slope of the points before them.
RECENT_SHARE = 1 / 3
MIN_RECENT_POINTS = 12
LEVELLED_SHARE = 0.25


def analyse(series: StepSeries) -> Forecast | NoForecast:
    """A forecast for one measured quantity, or the reason there is none."""
    if not series.limit_bytes > 0:
        return NoForecast(NO_LIMIT, f"no limit known for {series.metric}")
    skip = warmup_points(series.peak_bytes)
    xs = [float(s) for s in series.steps[skip:]]
    ys = [float(v) for v in series.peak_bytes[skip:]]
    if len(xs) < MIN_TREND_POINTS:
        detail = f"{len(xs)} steps past the warm-up; {MIN_TREND_POINTS} needed"
        return NoForecast(TOO_FEW_STEPS, detail, points=len(xs))
    fit = theil_sen(xs, ys)
    if fit is None or not _grows(fit, xs, ys):
        return NoForecast(NO_GROWTH, _flat_detail(fit, xs), points=len(xs))
    if (flat_since := _levelled_off_at(fit, xs, ys)) is not None:
        detail = f"growth stopped: no growth since step {flat_since:,}"
        return NoForecast(NO_GROWTH, detail, points=len(xs))
    last_step = int(series.steps[-1])
    # The first peak over the limit comes early when the peaks scatter upwards: the early
    # end uses the steepest slope of the interval and the limit less the scatter.
    reach = series.limit_bytes - Z_90 * fit.residual_spread
    early = _crossing(reach, fit.slope_high, fit.intercept_for(fit.slope_high, xs, ys))
    late = _crossing(series.limit_bytes, fit.slope_low, fit.intercept_for(fit.slope_low, xs, ys))
    central = _crossing(series.limit_bytes, fit.slope, fit.intercept)
    if (held := _first_epoch(series, fit, xs, ys, min(early, central))) is not None:
        return held
    measured = max(int(xs[-1] - xs[0]), 1)
    if central - last_step > MAX_EXTRAPOLATION * measured:
        detail = (
            f"at {format_bytes(fit.slope)} per step the limit is {central - last_step:,} steps "
            f"away, more than {MAX_EXTRAPOLATION} times the {measured:,} steps measured"
        )
        return NoForecast(BEYOND_REACH, detail, points=len(xs))
    end = series.planned_end_step
    if end is not None and last_step <= end < min(early, central):
        detail = (
            f"the loop ends at step {end:,}, before the limit (step {min(early, central):,} "
            "at the earliest)"
        )
        return NoForecast(ENDS_FIRST, detail, points=len(xs))
    pace = seconds_per_step(series.steps[skip:], series.times_s[skip:])
    return Forecast(
        metric=series.metric,
        limit_label=series.limit_label,
        limit_bytes=int(series.limit_bytes),
        t_s=float(series.times_s[-1]),
        step=last_step,
        current_bytes=int(fit.at(last_step)),
        growth_bytes_per_step=fit.slope,
        growth_low_bytes_per_step=fit.slope_low,
        growth_high_bytes_per_step=fit.slope_high,
        oom_step=central,
        oom_step_early=min(early, central),
        oom_step_late=max(late, central),
        eta_s=_eta(central, last_step, pace),
        eta_early_s=_eta(min(early, central), last_step, pace),
        eta_late_s=_eta(max(late, central), last_step, pace),
        seconds_per_step=pace,
        warmup_steps=skip,
        points=len(xs),
        device=series.device,
        pid=series.pid,
    )


def earliest(results: Sequence[Forecast | NoForecast]) -> Forecast | NoForecast | None:
    """The forecast that crosses first; else the most telling reason there is none."""
    forecasts = [r for r in results if isinstance(r, Forecast)]
    if forecasts:
        return min(forecasts, key=lambda f: (f.oom_step, f.eta_s or 0.0))
    reasons = [r for r in results if isinstance(r, NoForecast)]
    order = (ENDS_FIRST, FIRST_EPOCH, BEYOND_REACH, NO_GROWTH, TOO_FEW_STEPS, NO_LIMIT)
    return min(reasons, key=lambda r: order.index(r.reason)) if reasons else None


def seconds_per_step(steps: Sequence[int], times_s: Sequence[float]) -> float | None:
    """The recent pace: median seconds per step over the last points."""
    pairs = list(zip(steps[-PACE_POINTS:], times_s[-PACE_POINTS:], strict=True))
    rates = [
        (t1 - t0) / (s1 - s0)
        for (s0, t0), (s1, t1) in itertools.pairwise(pairs)
        if s1 > s0 and t1 >= t0
    ]
    return statistics.median(rates) if rates else None


def _grows(fit: LineFit, xs: Sequence[float], ys: Sequence[float]) -> bool:
    growth = fit.slope * (xs[-1] - xs[0])
    level = statistics.median(abs(y) for y in ys)
    return (
        fit.slope_low > 0
        and growth >= MIN_GROWTH_SPREADS * fit.residual_spread
        and growth >= MIN_GROWTH_SHARE * level
    )


def _levelled_off_at(fit: LineFit, xs: Sequence[float], ys: Sequence[float]) -> int | None:
    """The first step of the recent points when they no longer grow at a good part of the
    rate of the points before them; None while they do (or are too few to tell)."""
    count = max(MIN_RECENT_POINTS, math.ceil(len(xs) * RECENT_SHARE))
    if count >= len(xs) or not _stopped(fit, xs, ys, len(xs) - count):
        return None
    return int(xs[-count])


def _stopped(fit: LineFit, xs: Sequence[float], ys: Sequence[float], split: int) -> bool:
    """True when the points from `split` on grow at less than a good part of the rate of
    the points before them."""
    recent = theil_sen(xs[split:], ys[split:])
    before = theil_sen(xs[:split], ys[:split])
    rate = max(fit.slope, before.slope if before is not None else 0.0)
    return recent is not None and recent.slope_high < LEVELLED_SHARE * rate


def first_epoch_judged_at(start: int, length: int) -> int:
    """The step at which growth seen in a loop's first epoch (after step `start`, epochs of
    `length` steps) is judged: when the second epoch has run enough steps to show its own."""
    return start + length + min(MIN_RECENT_POINTS, length)


def _first_epoch(
    series: StepSeries, fit: LineFit, xs: Sequence[float], ys: Sequence[float], crossing: int
) -> NoForecast | None:
    """No forecast yet where the growth may be what fills once, in a loop's first epoch (a
    dataset cached in memory as it is first read): while the first epoch runs (and the
    first steps of the second) with the limit past it, and once an epoch after the first
    has run enough steps without the growth."""
    start, length = series.loop_start_step, series.epoch_steps
    last_step = int(xs[-1])
    if start is None or not length or last_step <= start:
        return None
    first_end = start + length
    judged_at = first_epoch_judged_at(start, length)
    if last_step < judged_at and crossing > judged_at:
        detail = (
            f"growth in the loop's first epoch only so far (it ends at step {first_end:,}), "
            f"and the limit lies past it (step {crossing:,} at the earliest): what fills once "
            "in the first epoch stops there"
        )
        return NoForecast(FIRST_EPOCH, detail, points=len(xs), judged_at_step=judged_at)
    epoch_start = start + 1 + (last_step - start - 1) // length * length
    split = bisect.bisect_left(xs, epoch_start)
    recent = len(xs) - split
    enough = recent >= MIN_RECENT_POINTS and split >= MIN_RECENT_POINTS
    if epoch_start > first_end and enough and _stopped(fit, xs, ys, split):
        detail = f"growth stopped: no growth in the epoch that began at step {epoch_start:,}"
        return NoForecast(NO_GROWTH, detail, points=len(xs))
    missing = MIN_RECENT_POINTS - recent
    waits_until = last_step + missing
    if epoch_start == first_end + 1 and missing > 0 and crossing > waits_until:
        # The second epoch has run its steps, but some had no reading (samples come every
        # interval; a busy machine stretches it): it has not shown enough of its own yet.
        detail = (
            f"growth in the loop's first epoch, and {recent} steps of the second read so far, "
            f"{MIN_RECENT_POINTS} needed to judge it; the limit lies past that"
        )
        return NoForecast(FIRST_EPOCH, detail, points=len(xs), judged_at_step=waits_until)
    return None


def _flat_detail(fit: LineFit | None, xs: Sequence[float]) -> str:
    steps = int(xs[-1] - xs[0]) if xs else 0
    if fit is None:
        return f"no growth over {steps} steps"
    return (
        f"no growth over {steps} steps "
        f"({format_bytes(fit.slope)} per step, within the scatter of the peaks)"
    )


def _crossing(limit_bytes: float, slope: float, intercept: float) -> int:
    if slope <= 0:
        return 2**62
    return math.ceil((limit_bytes - intercept) / slope)


def _eta(oom_step: int, last_step: int, pace_s: float | None) -> float | None:
    if pace_s is None or oom_step >= 2**62:
        return None
    return max(oom_step - last_step, 0) * pace_s
