"""Memory against batch size: fixed + per-sample × size, and the largest size that fits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.forecast.budget import Budget, budget_for, peak_source
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
    """peak = fixed_bytes + per_size_bytes × size, and what follows for the limit."""

    fixed_bytes: float
    per_size_bytes: float
    limit_bytes: float
    margin: float  # share of the limit kept free
    largest_size: int | None  # None: not even the fixed part fits
    multiple_of: int
    max_relative_error: float  # worst distance of a measured point from the line, relative

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
    """Least-squares line through the measured sizes; None with fewer than two sizes.

    `below` is a size known not to fit (a probe ran out of memory): the answer stays under it.
    """
    sizes = sorted({p.size for p in points})
    if len(sizes) < 2:
        return None
    n = len(points)
    mean_x = sum(p.size for p in points) / n
    mean_y = sum(p.peak_bytes for p in points) / n
    sxx = sum((p.size - mean_x) ** 2 for p in points)
    slope = sum((p.size - mean_x) * (p.peak_bytes - mean_y) for p in points) / sxx
    slope = max(slope, 0.0)
    fixed = mean_y - slope * mean_x
    error = max(abs(p.peak_bytes - fixed - slope * p.size) / p.peak_bytes for p in points)
    usable = limit_bytes * (1.0 - margin)
    largest: int | None
    if fixed >= usable:
        largest = None
    elif slope <= 0:
        largest = None  # memory does not grow with the size: no largest size to name
    else:
        raw = math.floor((usable - fixed) / slope + 1e-9)  # 199.99999… is 200
        if below is not None:
            raw = min(raw, below - 1)
        largest = raw - raw % multiple_of if raw >= multiple_of else None
    return HeadroomFit(
        fixed_bytes=fixed,
        per_size_bytes=slope,
        limit_bytes=limit_bytes,
        margin=margin,
        largest_size=largest,
        multiple_of=multiple_of,
        max_relative_error=error,
    )


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


def nearest_pair(points: Sequence[SizePeak]) -> list[SizePeak]:
    """The two largest measured sizes: their secant is the best slope near the limit, where
    the allocator's behaviour at large requests shows and small sizes no longer matter."""
    return sorted(points, key=lambda p: p.size)[-2:]
