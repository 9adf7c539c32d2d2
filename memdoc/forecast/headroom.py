"""Memory against batch size: fixed + per-sample × size, and the largest size that fits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.forecast.budget import Budget, budget_for, peak_source
from memdoc.forecast.fit import theil_sen
from memdoc.trace.model import EventKind, Metric
from memdoc.trace.reader import Trace


@dataclass(frozen=True)
class PeakReading:
    """The highest use of one run against its limit."""

    peak_bytes: float
    limit_bytes: float
    limit_label: str
    metric: str


@dataclass(frozen=True)
class SizePeak:
    """One measured size."""

    size: int
    peak_bytes: float


@dataclass(frozen=True)
class HeadroomFit:
    """peak = fixed_bytes + per_size_bytes × size, and the size it puts at the limit.

    The fit only chooses where to probe next: the answer of a search is a size that ran.
    """

    fixed_bytes: float
    per_size_bytes: float
    limit_bytes: float
    margin: float  # share of the limit kept free
    largest_size: int | None  # the fit's size at the limit; None: it finds no limit
    multiple_of: int
    max_relative_error: float  # worst distance of a measured point from the line, relative
    # The sizes at the limit that the ends of the slope's interval give (Theil–Sen with
    # Sen's 90% interval from three sizes on); None at the high end: no limit in reach.
    largest_low: int | None = None
    largest_high: int | None = None

    @property
    def usable_bytes(self) -> float:
        return self.limit_bytes * (1.0 - self.margin)

    def predicted_bytes(self, size: int) -> float:
        return self.fixed_bytes + self.per_size_bytes * size

    @property
    def dominant(self) -> str:
        """ "per-sample" or "fixed": the larger term at the largest size that fits."""
        size = self.largest_size or 0
        return "per-sample" if self.per_size_bytes * size > self.fixed_bytes else "fixed"


def run_peak(trace: Trace) -> PeakReading | None:
    """The run's peak against the limit closest to being hit (highest peak / limit).

    The address-space high-water mark the agent reads when it stops the run counts too: the
    sampler may miss a short spike between two samples.
    """
    stop_peaks = _stop_peaks(trace)
    best: PeakReading | None = None
    for key in trace.series_keys():
        budget = budget_for(key)
        if budget is None:
            continue
        limit, label = _lowest_limit(trace, budget)
        if not limit:
            continue
        values = [trace.series(key.metric, key.device, key.pid)]
        values += [
            trace.series(k.metric, k.device, k.pid)
            for k in trace.series_keys()
            if peak_source(k) == key
        ]
        peak = max((s.max() or (0.0, 0.0))[1] for s in values if s is not None)
        if key.metric == Metric.HOST_VMS and key.pid in stop_peaks:
            peak = max(peak, stop_peaks[key.pid])
        reading = PeakReading(peak, limit, label, key.metric)
        if best is None or peak / limit > best.peak_bytes / best.limit_bytes:
            best = reading
    return best


def fit_headroom(
    points: Sequence[SizePeak],
    limit_bytes: float,
    *,
    margin: float,
    multiple_of: int = 1,
    below: int | None = None,
) -> HeadroomFit | None:
    """A line through every measured size, robust to a noisy peak; None with fewer than two
    sizes.

    From three sizes on it is Theil–Sen's (the median of the pairwise slopes, with Sen's
    interval): one peak that did not rise with its size moves it little. Two sizes give
    their secant. A slope that is not positive finds no limit (`largest_size` None); it
    never says that nothing fits, which only a probe can say. `below` is a size known not to
    fit (a probe ran out of memory): the sizes named stay under it.
    """
    sizes = sorted({p.size for p in points})
    if len(sizes) < 2:
        return None
    xs = [float(p.size) for p in points]
    ys = [p.peak_bytes for p in points]
    robust = theil_sen(xs, ys) if len(sizes) >= 3 else None
    if robust is not None:
        slope, fixed = robust.slope, robust.intercept
        ends = [(s, robust.intercept_for(s, xs, ys)) for s in (robust.slope_high, robust.slope_low)]
    else:
        slope, fixed = _secant(points)
        ends = [(slope, fixed), (slope, fixed)]
    error = max(abs(p.peak_bytes - fixed - slope * p.size) / p.peak_bytes for p in points)
    usable = limit_bytes * (1.0 - margin)
    low, high = (_size_at(s, f, usable, multiple_of, below) for s, f in ends)
    return HeadroomFit(
        fixed_bytes=fixed,
        per_size_bytes=slope,
        limit_bytes=limit_bytes,
        margin=margin,
        largest_size=_size_at(slope, fixed, usable, multiple_of, below),
        multiple_of=multiple_of,
        max_relative_error=error,
        largest_low=low,
        largest_high=high,
    )


def _secant(points: Sequence[SizePeak]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line: the secant when there are two sizes."""
    n = len(points)
    mean_x = sum(p.size for p in points) / n
    mean_y = sum(p.peak_bytes for p in points) / n
    sxx = sum((p.size - mean_x) ** 2 for p in points)
    slope = sum((p.size - mean_x) * (p.peak_bytes - mean_y) for p in points) / sxx
    return slope, mean_y - slope * mean_x


def _size_at(
    slope: float, fixed: float, usable: float, multiple_of: int, below: int | None
) -> int | None:
    """The largest multiple of `multiple_of` the line keeps under `usable` (and under
    `below`); None where the line does not rise, or is over `usable` from the start."""
    if slope <= 0 or fixed >= usable:
        return None
    raw = math.floor((usable - fixed) / slope + 1e-9)  # 199.99999… is 200
    if below is not None:
        raw = min(raw, below - 1)
    return raw - raw % multiple_of if raw >= multiple_of else None


def _stop_peaks(trace: Trace) -> dict[int, float]:
    out: dict[int, float] = {}
    for event in trace.events(EventKind.STOP):
        host = event.data.get("host")
        if event.pid is None or not isinstance(host, dict):
            continue
        peak = host.get("address_space_peak_bytes")
        if isinstance(peak, (int, float)):
            out[event.pid] = float(peak)
    return out


def _lowest_limit(trace: Trace, budget: Budget) -> tuple[float | None, str]:
    """The lowest value the limit took during the run: a cap set by the program after its
    start counts from then on."""
    limit = budget.limit
    if limit is not None:
        series = trace.series(limit.metric, limit.device, limit.pid)
        if series is not None and len(series):
            return min(series.values), budget.label
    if budget.total_device is not None:
        return trace.device_total_bytes(budget.total_device), budget.total_label
    return None, budget.label
