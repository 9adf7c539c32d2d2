"""The ledger bar's segments: the shared device ledger's terms, and the host's memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from memdoc.rules.host import LIMIT_NAMES
from memdoc.trace.ledger import (
    ALLOCATED,
    CACHED_FREE,
    FREE,
    OTHER_PROCESSES,
    PROCESS_OTHER,
    RESERVED,
    UNEXPLAINED,
    Ledger,
)


@dataclass(frozen=True)
class Segment:
    """One part of the device bar: a stable key (for styling), a label and its size."""

    key: str
    label: str
    size_bytes: int | None


# Ledger term key -> (segment key, label), in drawing order; frameworks share a segment.
# Free comes last so that it takes the cells rounding leaves over.
_SEGMENTS = (
    (ALLOCATED, "allocated", "allocated"),
    (CACHED_FREE, "cached", "cached free"),
    (RESERVED, "cached", "pool (split unknown)"),
    (PROCESS_OTHER, "ours_other", "other (this run)"),
    (OTHER_PROCESSES, "others", "other processes"),
    (UNEXPLAINED, "unexplained", "unexplained"),
    (FREE, "free", "free"),
)


@dataclass(frozen=True)
class DeviceBar:
    """One device's ledger (the one the report shows too), as the bar draws it.

    Two bars are equal when they draw the same: the instant is left out, so that an
    unchanged device is not redrawn every frame.
    """

    drawn: tuple[Segment, ...]
    capacity_bytes: int | None  # the total, else what is known
    used_fraction: float | None
    ledger: Ledger = field(compare=False)

    @classmethod
    def of(cls, ledger: Ledger) -> DeviceBar:
        return cls(_segments(ledger), _capacity_bytes(ledger), _used_fraction(ledger), ledger)

    def segments(self) -> list[Segment]:
        """Bar segments in drawing order; a segment with size None was not measured."""
        return list(self.drawn)


def _segments(ledger: Ledger) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for term_key, key, label in _SEGMENTS:
        # In a system view no process is the run's: they are all just processes.
        system = term_key == OTHER_PROCESSES and not ledger.run_known
        shown = "processes" if system else label
        size = ledger.term(term_key)
        if size is not None and (size or term_key != UNEXPLAINED):
            out.append(Segment(key, shown, size))
        elif term_key in ledger.unknown:
            out.append(Segment(key, shown, None))
    return tuple(out)


def _capacity_bytes(ledger: Ledger) -> int | None:
    if ledger.total_bytes:
        return ledger.total_bytes
    known = sum(max(0, term.bytes) for term in ledger.terms)
    return known or None


def _used_fraction(ledger: Ledger) -> float | None:
    """How full the device is: all but the free term, else the framework pools."""
    total = ledger.total_bytes
    if not total:
        return None
    free = ledger.term(FREE)
    if free is not None:
        used = total - free
    else:
        pools = [ledger.term(key) for key in (ALLOCATED, CACHED_FREE, RESERVED)]
        if all(p is None for p in pools):
            return None
        used = sum(p or 0 for p in pools)
    return min(1.0, max(0.0, used / total))


@dataclass(frozen=True)
class HostLedger:
    """Host memory as a bar against the limit that binds the run (an address-space cap, a
    cgroup, or RAM): the run's RSS, what else the limit counts, and what is left."""

    total_bytes: int | None
    available_bytes: int | None
    rss_bytes: int | None  # the run's process tree; None for a system view
    limit_bytes: int | None = None  # the tightest limit, when it is not RAM
    limit_kind: str = "ram"  # "rlimit-as", "cgroup" or "ram"
    counted_bytes: int | None = None  # what that limit counts (cgroup usage, address space)

    @property
    def capacity_bytes(self) -> int | None:
        return self.limit_bytes if self.limit_bytes else self.total_bytes

    @property
    def limit_name(self) -> str:
        return LIMIT_NAMES.get(self.limit_kind, self.limit_kind) if self.limit_bytes else "RAM"

    def segments(self) -> list[Segment]:
        if self.limit_bytes:
            return self._under_limit(self.limit_bytes)
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

    def _under_limit(self, limit_bytes: int) -> list[Segment]:
        """The run's RSS, the rest of what the limit counts, and the room left under it."""
        rss = self.rss_bytes or 0
        counted = max(self.counted_bytes or 0, rss)
        out = [Segment("ours_rss", "this run (RSS)", self.rss_bytes)]
        if self.counted_bytes is not None:
            label = "rest of the cgroup" if self.limit_kind == "cgroup" else "mapped, not resident"
            out.append(Segment("others", label, counted - rss))
        out.append(Segment("free", "left under the limit", max(0, limit_bytes - counted)))
        return out
