"""The memory ledger of one device at one instant, computed from a trace."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memdoc.trace import Metric, Trace
from memdoc.trace.model import FRAMEWORK_PREFIXES


@dataclass(frozen=True)
class Segment:
    """One part of the device bar: a stable key (for styling), a label and its size."""

    key: str
    label: str
    size_bytes: int | None


@dataclass(frozen=True)
class Ledger:
    """What each layer sees of one device. None means not recorded (never 0)."""

    device: int
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None
    ours_used_bytes: int | None  # NVML per-process used, summed over the run's processes
    others_used_bytes: int | None  # NVML per-process used of every other process
    has_ours: bool  # the trace knows processes of its own run

    @property
    def cached_free_bytes(self) -> int | None:
        if self.reserved_bytes is None or self.allocated_bytes is None:
            return None
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def ours_other_bytes(self) -> int | None:
        """Our processes' memory outside the framework pool: contexts, workspaces, the rest."""
        if self.ours_used_bytes is not None:
            return max(0, self.ours_used_bytes - (self.reserved_bytes or 0))
        if self.used_bytes is not None and self.reserved_bytes is not None:
            # No per-process numbers: whatever the driver counts beyond the pool and the
            # other processes is attributed to us, and shown rather than hidden.
            return max(0, self.used_bytes - self.reserved_bytes - (self.others_used_bytes or 0))
        return None

    @property
    def other_processes_bytes(self) -> int | None:
        if self.used_bytes is not None and self.ours_used_bytes is not None:
            return max(0, self.used_bytes - self.ours_used_bytes)
        if self.used_bytes is not None and not self.has_ours:
            return self.used_bytes  # a system view: everything used belongs to someone else
        return self.others_used_bytes

    @property
    def capacity_bytes(self) -> int | None:
        """The size the bar is drawn against: the device total, else what is known."""
        if self.total_bytes:
            return self.total_bytes
        if self.used_bytes is not None and self.free_bytes is not None:
            return self.used_bytes + self.free_bytes
        known = [s.size_bytes for s in self.segments() if s.size_bytes]
        return sum(known) if known else None

    @property
    def used_fraction(self) -> float | None:
        """How full the device is, from the driver's view, else from the framework pool."""
        capacity = self.total_bytes
        used = self.used_bytes if self.used_bytes is not None else self.reserved_bytes
        if not capacity or used is None:
            return None
        return min(1.0, used / capacity)

    def segments(self) -> list[Segment]:
        """Bar segments in drawing order; a segment with size None is unknown."""
        out: list[Segment] = []
        if self.has_ours or self.reserved_bytes is not None:
            out.append(Segment("allocated", "allocated", self.allocated_bytes))
            out.append(Segment("cached", "cached free", self.cached_free_bytes))
            out.append(Segment("ours_other", "other (this run)", self.ours_other_bytes))
        label = "other processes" if self.has_ours else "used"
        out.append(Segment("others", label, self.other_processes_bytes))
        out.append(Segment("free", "free", self._free()))
        return out

    def _free(self) -> int | None:
        if self.free_bytes is not None:
            return self.free_bytes
        if self.total_bytes is not None and self.used_bytes is not None:
            return max(0, self.total_bytes - self.used_bytes)
        return None


def ledger_at(trace: Trace, device: int, t: float) -> Ledger:
    """The ledger of `device` from the last values recorded at or before `t`."""
    ours = trace.our_pids()
    ours_used: int | None = None
    others_used: int | None = None
    for series in trace.series_for(Metric.GPU_PROC_USED, device=device):
        value = series.at(t)
        if value is None:
            continue
        if series.key.pid in ours:
            ours_used = (ours_used or 0) + int(value)
        else:
            others_used = (others_used or 0) + int(value)
    total = trace.device_total_bytes(device)
    return Ledger(
        device=device,
        total_bytes=total,
        used_bytes=_value_at(trace, Metric.GPU_USED, device, t),
        free_bytes=_value_at(trace, Metric.GPU_FREE, device, t),
        allocated_bytes=_framework_sum(trace, Metric.ALLOCATED, device, t),
        reserved_bytes=_framework_sum(trace, Metric.RESERVED, device, t),
        ours_used_bytes=ours_used,
        others_used_bytes=others_used,
        has_ours=bool(ours),
    )


def framework_metrics(quantity: str) -> Iterable[str]:
    """`torch.allocated`, `tf.allocated`, ... for a quantity."""
    return (f"{prefix}.{quantity}" for prefix in FRAMEWORK_PREFIXES.values())


def _framework_sum(trace: Trace, quantity: str, device: int, t: float) -> int | None:
    total: int | None = None
    for metric in framework_metrics(quantity):
        for series in trace.series_for(metric, device=device):
            value = series.at(t)
            if value is not None:
                total = (total or 0) + int(value)
    return total


def _value_at(trace: Trace, metric: str, device: int, t: float) -> int | None:
    series = trace.series(metric, device=device)
    value = series.at(t) if series is not None else None
    return int(value) if value is not None else None


@dataclass(frozen=True)
class HostLedger:
    """Host memory as a bar: the run's RSS, everything else in use, and what is available."""

    total_bytes: int | None
    available_bytes: int | None
    rss_bytes: int | None  # the run's process tree; None for a system view
    limit_bytes: int | None  # the cgroup's limit, when there is one

    @property
    def capacity_bytes(self) -> int | None:
        return self.total_bytes

    def segments(self) -> list[Segment]:
        out: list[Segment] = []
        used = None
        if self.total_bytes is not None and self.available_bytes is not None:
            used = max(0, self.total_bytes - self.available_bytes)
        if self.rss_bytes is not None:
            out.append(Segment("ours_rss", "this run (RSS)", self.rss_bytes))
            used = max(0, used - self.rss_bytes) if used is not None else None
            out.append(Segment("others", "other used", used))
        else:
            out.append(Segment("others", "used", used))
        out.append(Segment("free", "available", self.available_bytes))
        return out
