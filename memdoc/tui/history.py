"""The history chart's data: per-column levels, the interval-peak envelope and event ticks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memdoc.trace import Metric, Series, Trace, framework_metric
from memdoc.trace.model import FRAMEWORK_PREFIXES
from memdoc.tui.timeline import EventIndex

# Tick kinds, in rising priority: a column shows the most important event that fell in it.
TICK_STEP = "step"
TICK_MARK = "mark"
TICK_OOM = "oom"
_TICK_RANK = {"": 0, TICK_STEP: 1, TICK_MARK: 2, TICK_OOM: 3}

Column = float | None


@dataclass(frozen=True)
class Window:
    """The time span the chart shows, cut into `columns` equal parts."""

    t0_s: float
    t1_s: float
    columns: int
    end_s: float | None = None  # nothing after this instant is shown (t1_s when None)

    @property
    def last_s(self) -> float:
        return self.t1_s if self.end_s is None else min(self.t1_s, self.end_s)

    def column(self, t: float) -> int:
        span = max(self.t1_s - self.t0_s, 1e-9)
        return min(self.columns - 1, max(0, int((t - self.t0_s) / span * self.columns)))


@dataclass(frozen=True)
class ChartData:
    """One value per column of `window`; None where nothing was recorded yet."""

    window: Window
    level: tuple[Column, ...]  # the main series: allocated, else driver used, else host RSS
    band: tuple[Column, ...]  # drawn behind the level: the framework pool (reserved)
    peak: tuple[Column, ...]  # highest value inside each column, interval peaks included
    ticks: tuple[str, ...]
    level_label: str
    band_label: str | None
    limit_bytes: float | None  # the device (or host) capacity
    scale_bytes: float  # the value at the top of the chart


@dataclass(frozen=True)
class _Layer:
    label: str
    values: list[Series]
    peaks: list[Series] = field(default_factory=list)
    transform: Callable[[float], float] | None = None


def device_chart(trace: Trace, events: EventIndex, device: int, window: Window) -> ChartData:
    """The chart of one GPU: framework allocated over reserved, else the driver's used."""
    allocated = _framework(trace, Metric.ALLOCATED, device)
    band: _Layer | None = None
    if allocated:
        level = _Layer("allocated", allocated, _framework(trace, Metric.ALLOCATED_PEAK, device))
        reserved = _framework(trace, Metric.RESERVED, device)
        band = _Layer("reserved", reserved, _framework(trace, Metric.RESERVED_PEAK, device))
    else:
        level = _Layer("used", trace.series_for(Metric.GPU_USED, device=device))
    total = trace.device_total_bytes(device)
    return _chart(events, window, level, band, float(total) if total else None)


def host_chart(trace: Trace, events: EventIndex, window: Window, limit: float | None) -> ChartData:
    """The chart when there is no GPU: the run's RSS, else the system's used memory, under
    `limit`, the job's tightest limit (an address-space cap, a cgroup, or RAM)."""
    rss = trace.series(Metric.HOST_RSS)
    if rss is not None:
        level = _Layer("host RSS", [rss])
    else:
        available = trace.series(Metric.HOST_AVAILABLE)
        total = _last(trace, Metric.HOST_TOTAL) or 0.0
        level = _Layer(
            "system used",
            [available] if available is not None else [],
            transform=lambda v: max(0.0, total - v),
        )
    return _chart(events, window, level, None, limit)


def _chart(
    events: EventIndex, window: Window, level: _Layer, band: _Layer | None, limit: float | None
) -> ChartData:
    level_cols = _summed(level.values, window, level.transform)
    peak_cols = _envelope(level_cols, level.peaks, window)
    band_cols: tuple[Column, ...] = (None,) * window.columns
    if band is not None:
        band_cols = _envelope(_summed(band.values, window), band.peaks, window)
    highest = max((v for v in (*peak_cols, *band_cols) if v is not None), default=0.0)
    return ChartData(
        window=window,
        level=level_cols,
        band=band_cols,
        peak=peak_cols,
        ticks=_ticks(events, window),
        level_label=level.label,
        band_label=band.label if band and band.values else None,
        limit_bytes=limit,
        scale_bytes=_scale(highest, limit),
    )


def _summed(
    series: Sequence[Series], window: Window, transform: Callable[[float], float] | None = None
) -> tuple[Column, ...]:
    """Each series' last value in every column (carried forward), summed over series."""
    total: list[Column] = [None] * window.columns
    last_column = window.column(window.last_s)
    for one in series:
        per_column: list[Column] = [None] * window.columns
        times, values = one.window(window.t0_s, window.last_s)
        for t, v in zip(times, values, strict=True):
            per_column[window.column(t)] = v
        carried = one.at(window.t0_s)
        for c in range(last_column + 1):
            if per_column[c] is None:
                per_column[c] = carried
            carried = value = per_column[c]
            if value is not None:
                total[c] = (total[c] or 0.0) + (transform(value) if transform else value)
    return tuple(total)


def _envelope(
    level: tuple[Column, ...], peaks: Sequence[Series], window: Window
) -> tuple[Column, ...]:
    """The highest value each column saw: the level itself, or a recorded interval peak."""
    out = list(level)
    per_column = [0.0] * window.columns
    for one in peaks:
        times, values = one.window(window.t0_s, window.last_s)
        column_max: dict[int, float] = {}
        for t, v in zip(times, values, strict=True):
            c = window.column(t)
            column_max[c] = max(column_max.get(c, v), v)
        for c, v in column_max.items():
            per_column[c] += v
    for c, value in enumerate(per_column):
        current = out[c]
        if value and (current is None or value > current):
            out[c] = value
    return tuple(out)


def _ticks(events: EventIndex, window: Window) -> tuple[str, ...]:
    ticks = [""] * window.columns
    kinds = (
        (TICK_STEP, events.step_times),
        (TICK_MARK, events.mark_times),
        (TICK_OOM, events.oom_times),
    )
    for tick, times in kinds:
        for t in EventIndex.between(times, window.t0_s, window.last_s):
            c = window.column(t)
            if _TICK_RANK[tick] > _TICK_RANK[ticks[c]]:
                ticks[c] = tick
    return tuple(ticks)


def _scale(highest: float, limit: float | None) -> float:
    """A round top value (in binary units) a little above the highest point.

    The capacity itself when the highest point comes close to it.
    """
    if limit and highest > 0.8 * limit:
        return max(limit, highest)
    if highest <= 0:
        return limit or 1.0
    unit = 1.0
    while unit * 1024 <= highest:
        unit *= 1024
    scaled = highest / unit
    step = 1.0
    while step * 10 <= scaled:
        step *= 10
    for factor in (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if step * factor >= scaled * 1.05:
            return step * factor * unit
    return highest * 1.1


def _framework(trace: Trace, quantity: str, device: int) -> list[Series]:
    metrics = [framework_metric(fw, quantity) for fw in FRAMEWORK_PREFIXES]
    return [s for metric in metrics for s in trace.series_for(metric, device=device)]


def _last(trace: Trace, metric: str) -> float | None:
    series = trace.series(metric)
    last = series.last() if series is not None else None
    return last[1] if last is not None else None
