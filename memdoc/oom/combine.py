"""Order the parsers' hits, join each error with its context and echoes, one OomInfo per error."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field, fields, replace
from typing import Any

from memdoc.kinds import OomKind
from memdoc.oom.context import phase_at
from memdoc.oom.fields import is_huge
from memdoc.oom.logtext import Hit, LogText
from memdoc.trace.model import OomInfo

# An identical error this many lines after the last one is its echo (a chained traceback
# re-raises it, a launcher prints it again); further away it is a new failure.
DUPLICATE_GAP = 500
# An error that carries no identity (no size, no pid) joins a neighbour this close.
ADJACENT_GAP = 60
# Incidents still open for a merge: ranks interleave their lines in a shared log.
RECENT = 16
# Frameworks that print each other's allocator lines (XLA's BFC allocator is TensorFlow's).
_XLA_FAMILY = frozenset({"tensorflow", "jax", "unknown"})


@dataclass
class _Incident:
    """Hits that make up one error, with the running facts the merge decisions need."""

    hits: list[Hit] = field(default_factory=list)
    line: int = 0  # first line where the error starts (notes excluded)
    end: int = 0
    rank: int | None = None
    reach: int = 0
    # One representative error per distinct identity: echoes add no new comparisons.
    errors: dict[tuple[object, ...], Hit] = field(default_factory=dict)

    notes_only: bool = True

    def add(self, hit: Hit) -> None:
        if not self.hits or (hit.role != "note" and (hit.line < self.line or self.notes_only)):
            self.line = hit.line
        self.notes_only = self.notes_only and hit.role == "note"
        self.hits.append(hit)
        self.end = max(self.end, hit.end)
        self.rank = self.rank if self.rank is not None else hit.rank
        self.reach = max(self.reach, hit.reach)
        if hit.role == "error":
            self.errors.setdefault(_identity(hit), hit)


def combine(hits: list[Hit], log: LogText) -> list[OomInfo]:
    """One OomInfo per memory error, in order of appearance."""
    incidents: list[_Incident] = []
    for hit in _one_per_line(hits):
        target = next((inc for inc in reversed(incidents[-RECENT:]) if _joins(inc, hit)), None)
        if target is None:
            target = _Incident()
            incidents.append(target)
        target.add(hit)
    # An incident of notes alone is context without an error (a device's free memory). Notes
    # join the next error even past an earlier incident, so order by where errors start.
    kept = sorted((inc for inc in incidents if not inc.notes_only), key=lambda inc: inc.line)
    return [_merge(inc, log) for inc in kept]


def _identity(hit: Hit) -> tuple[object, ...]:
    info = hit.info
    return (info.kind, info.library, info.framework, info.device, hit.key)


def _one_per_line(hits: list[Hit]) -> list[Hit]:
    """The most specific hit of each line; weak (fallback) hits inside another's text go."""
    best: dict[int, Hit] = {}
    for hit in hits:
        current = best.get(hit.line)
        if current is None or hit.priority < current.priority:
            best[hit.line] = hit
    strong = sorted((h.line, h.end) for h in best.values() if not h.weak)
    starts = [span[0] for span in strong]
    covered: list[int] = []  # furthest end among spans starting at or before each start
    furthest = -1
    for _, end in strong:
        furthest = max(furthest, end)
        covered.append(furthest)
    kept = []
    for hit in sorted(best.values(), key=lambda h: h.line):
        if hit.weak:
            index = bisect_right(starts, hit.line) - 1
            if index >= 0 and covered[index] >= hit.line:
                continue
        kept.append(hit)
    return kept


def _joins(incident: _Incident, hit: Hit) -> bool:
    if incident.rank is not None and hit.rank is not None and incident.rank != hit.rank:
        return False
    gap = max(0, hit.line - incident.end)
    if not incident.errors:
        # Context (a BFC dump, the kernel's "invoked oom-killer") runs into what follows.
        return gap <= incident.reach and all(_same_family(h, hit) for h in incident.hits[:8])
    if hit.role != "error":
        return False
    return any(_echo(error, hit, gap) for error in incident.errors.values())


def _same_family(context: Hit, hit: Hit) -> bool:
    a, b = context.info.framework, hit.info.framework
    if a == b:
        return True
    return (context.soft or hit.soft) and a in _XLA_FAMILY and b in _XLA_FAMILY


def _echo(first: Hit, hit: Hit, gap: int) -> bool:
    """Whether `hit` repeats the error `first` (same failure printed again)."""
    a, b = first.info, hit.info
    if not _same_kind(a, b) or a.library != b.library:
        return False
    if a.framework != b.framework and "unknown" not in (a.framework, b.framework):
        return False
    if a.device is not None and b.device is not None and a.device != b.device:
        return False
    if first.key and hit.key:
        return first.key == hit.key and gap <= DUPLICATE_GAP
    if first.key or hit.key:
        return gap <= ADJACENT_GAP
    return gap <= DUPLICATE_GAP


def _same_kind(a: OomInfo, b: OomInfo) -> bool:
    """Equal kinds; or XLA's error with its buffer assignment and the bare line JAX re-raises."""
    return a.kind == b.kind or (
        {a.kind, b.kind} == {OomKind.COMPILE, OomKind.ALLOCATOR}
        and bool({a.framework, b.framework} <= _XLA_FAMILY)
    )


def _merge(incident: _Incident, log: LogText) -> OomInfo:
    """The first error's fields, completed by its context and echoes."""
    errors = [h for h in incident.hits if h.role == "error"]
    primary = errors[0] if errors else min(incident.hits, key=lambda h: h.line)
    # Context and echoes, nearest first; a long run of echoes adds nothing after a few.
    others = [h for h in incident.hits if h is not primary and h.role != "error"][:32]
    others += [h for h in errors[1:33] if h is not primary]
    merged = primary.info
    changes: dict[str, Any] = {}
    for f in fields(OomInfo):
        if f.name in ("requested_unknown_huge", "processes", "line", "framework", "phase"):
            continue
        if getattr(merged, f.name) not in (None, (), ""):
            continue
        for other in others:
            candidate = getattr(other.info, f.name)
            if candidate not in (None, (), ""):
                changes[f.name] = candidate
                break
    merged = replace(merged, **changes)
    if "requested_bytes" in changes:
        source = next(h for h in others if h.info.requested_bytes == merged.requested_bytes)
        huge = source.info.requested_unknown_huge
    else:
        huge = primary.info.requested_unknown_huge
    framework = primary.info.framework
    if primary.soft:
        framework = next((h.info.framework for h in others if not h.soft), framework)
    processes = max(
        (h.info.processes for h in [primary, *others]),
        key=lambda ps: (sum(p.used_bytes is not None for p in ps), len(ps)),
    )
    return replace(
        merged,
        framework=framework,
        processes=processes,
        requested_unknown_huge=huge or is_huge(merged.requested_bytes),
        phase=phase_at(log, primary.line, primary.end) or primary.info.phase,
        line=incident.line + 1,
    )
