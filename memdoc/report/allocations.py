"""Allocation sites and fragmentation from a PyTorch snapshot that a trace references."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memdoc.errors import MemdocError
from memdoc.trace import Event, EventKind, Trace

if TYPE_CHECKING:
    from memdoc.importers.allocations import SnapshotAnalysis

MAX_SITES = 15


@dataclass(frozen=True)
class AllocationSite:
    """Live memory attributed to one source line (the innermost frame of user code)."""

    site: str  # "train.py:42:forward", or "(no stack recorded)"
    bytes: int
    share: float  # of the snapshot's live bytes, in [0, 1]
    count: int  # live blocks allocated there
    stack: tuple[str, ...] = ()  # "file:line:function" of the largest block, innermost first


@dataclass(frozen=True)
class Fragmentation:
    """How the allocator's pool was split when the snapshot was taken."""

    reserved_bytes: int
    allocated_bytes: int
    free_bytes: int  # cached, free for reuse
    largest_free_block_bytes: int
    inactive_split_bytes: int  # free pieces inside segments that also hold live blocks
    segments: int
    request_fits_largest_free: bool | None  # None when no failed request is recorded
    # 1 - largest free block / total free (the TensorFlow profiler's measure); None when
    # nothing is free.
    ratio: float | None = None


@dataclass(frozen=True)
class WhatIfRow:
    """A change and whether it would have avoided the OOM, in the importer's words."""

    change: str
    verdict: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Allocations:
    """What the snapshot says: the top allocation sites, the pool's state, and what-ifs."""

    snapshot: str  # the path as the trace names it
    reason: str | None  # oom, end, mark
    device: int
    requested_bytes: int | None  # the failed request, when the snapshot was taken at an OOM
    live_bytes: int
    sites: tuple[AllocationSite, ...]
    other_bytes: int  # live bytes of the sites beyond those listed
    fragmentation: Fragmentation
    what_if: tuple[WhatIfRow, ...] = ()


def chosen_snapshot(trace: Trace) -> Event | None:
    """The PyTorch snapshot taken at an OOM if any, else the last one (JAX's pprof profiles,
    saved as snapshot events too, are not pickles and are left to their own reader)."""
    snapshots = [
        e
        for e in trace.events(EventKind.SNAPSHOT)
        if isinstance(e.data.get("path"), str) and e.data.get("format") != "pprof"
    ]
    chosen = [e for e in snapshots if e.data.get("reason") == "oom"] or snapshots
    return chosen[-1] if chosen else None


def load_allocations(trace: Trace, warnings: list[str]) -> Allocations | None:
    """Analyse the referenced snapshot; None when there is none or it cannot be read here."""
    event = chosen_snapshot(trace)
    if event is None:
        return None
    # The importers are loaded only for a run that saved a snapshot: the end-of-run summary
    # and every report of a run without one do not need them.
    from memdoc.importers import JAX_MEMORY_PROFILE, detect
    from memdoc.importers.allocations import analyse_snapshot_file

    name = str(event.data["path"])
    # A snapshot beside the trace is named relative to it; an imported one as it was given.
    base = trace.path.parent if trace.path is not None else Path(".")
    try:
        if detect(base / name) == JAX_MEMORY_PROFILE:
            return None  # a profile from a trace written before events named their format
        analysis = analyse_snapshot_file(base / name)
    except MemdocError as exc:
        # The message names the file already.
        warnings.append(f"snapshot {exc.message}; allocation sites left out")
        return None
    reason = event.data.get("reason")
    return from_analysis(analysis, snapshot=name, reason=str(reason) if reason else None)


def from_analysis(analysis: SnapshotAnalysis, *, snapshot: str, reason: str | None) -> Allocations:
    held = analysis.at_snapshot
    sites = tuple(
        AllocationSite(
            site=str(h.site) if h.site is not None else "(no stack recorded)",
            bytes=h.live_bytes,
            share=h.share,
            count=h.allocations,
            stack=tuple(str(frame) for frame in h.stack),
        )
        for h in held.top[:MAX_SITES]
    )
    listed = sum(site.bytes for site in sites)
    pool = analysis.fragmentation.total
    return Allocations(
        snapshot=snapshot,
        reason=reason,
        device=analysis.device,
        requested_bytes=analysis.oom.requested_bytes if analysis.oom is not None else None,
        live_bytes=held.total_live_bytes,
        sites=sites,
        other_bytes=max(held.total_live_bytes - listed, 0),
        fragmentation=Fragmentation(
            reserved_bytes=pool.reserved_bytes,
            allocated_bytes=pool.allocated_bytes,
            free_bytes=pool.free_bytes,
            largest_free_block_bytes=pool.largest_free_bytes,
            inactive_split_bytes=pool.inactive_split_bytes,
            segments=pool.segments,
            request_fits_largest_free=analysis.fragmentation.fits_largest_free,
            ratio=pool.fragmentation,
        ),
        what_if=tuple(WhatIfRow(w.change, w.verdict, tuple(w.reasons)) for w in analysis.what_if),
    )
