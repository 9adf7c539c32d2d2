"""Answers from a PyTorch memory snapshot: who holds the memory, how fragmented it is, what if."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from memdoc.importers.fragmentation import (
    Fragmentation,
    OomRequest,
    PoolState,
    fragmentation_of,
    last_oom,
)
from memdoc.importers.holders import TOP_N, Holder, Holders, holders, is_user_frame, site_of
from memdoc.importers.snapshot_replay import (
    allocated_bytes_at_snapshot,
    live_at,
    live_at_snapshot,
    replay,
    reserved_bytes_at_snapshot,
)
from memdoc.importers.torch_snapshot import Snapshot, read_snapshot
from memdoc.importers.what_if import WhatIf, what_if

__all__ = [
    "Fragmentation",
    "Holder",
    "Holders",
    "OomRequest",
    "PoolState",
    "SnapshotAnalysis",
    "WhatIf",
    "analyse_snapshot",
    "analyse_snapshot_file",
    "is_user_frame",
    "main_device",
    "site_of",
    "snapshot_file",
]


@dataclass(frozen=True)
class SnapshotAnalysis:
    """Everything memdoc reads from one device of a snapshot."""

    device: int
    source: Path | None
    era: str  # "history" (PyTorch 2.0) or "frames" (2.1 and later)
    reserved_bytes: int
    allocated_bytes: int
    oom: OomRequest | None
    at_snapshot: Holders
    at_peak: Holders | None  # None when the trace places no higher peak before the snapshot
    peak_allocated_bytes: int
    fragmentation: Fragmentation
    what_if: tuple[WhatIf, ...]
    expandable_segments: bool | None  # None when the snapshot does not say


def snapshot_file(event_path: str, trace_path: Path | None) -> Path:
    """Where the file of a `snapshot` event is: its path is relative to the trace's folder."""
    path = Path(event_path)
    if path.is_absolute() or trace_path is None:
        return path
    return trace_path.parent / path


def analyse_snapshot_file(
    path: str | os.PathLike[str], device: int | None = None, top_n: int = TOP_N
) -> SnapshotAnalysis:
    """Read a snapshot pickle safely and analyse it (see `analyse_snapshot`).

    Raises:
        InputError: the file is missing or unreadable.
        RefusedPickle: the file would run code, is damaged, or is too large.
        NotASnapshot: the pickle holds something else.
    """
    return analyse_snapshot(read_snapshot(path), device, top_n)


def analyse_snapshot(
    snapshot: Snapshot, device: int | None = None, top_n: int = TOP_N
) -> SnapshotAnalysis:
    """Analyse one device: the one given, else the one with an OOM, else the largest pool."""
    chosen = device if device is not None else main_device(snapshot)
    oom = last_oom(snapshot, chosen)
    segments = snapshot.segments_on(chosen)
    fragmentation = fragmentation_of(segments, oom)
    curve = replay(snapshot, chosen)
    peak = curve.peak_index
    at_peak = None
    if peak < len(curve.allocated) - 1:
        live = live_at(snapshot, chosen, peak).values()
        at_peak = holders(live, "peak", curve.time_us(peak), top_n)
    expandable = snapshot.expandable_segments
    return SnapshotAnalysis(
        device=chosen,
        source=snapshot.source,
        era=snapshot.era,
        reserved_bytes=reserved_bytes_at_snapshot(snapshot, chosen),
        allocated_bytes=allocated_bytes_at_snapshot(snapshot, chosen),
        oom=oom,
        at_snapshot=holders(live_at_snapshot(snapshot, chosen).values(), "snapshot", None, top_n),
        at_peak=at_peak,
        peak_allocated_bytes=curve.allocated[peak],
        fragmentation=fragmentation,
        what_if=what_if(segments, fragmentation.total, oom, expandable),
        expandable_segments=expandable,
    )


def main_device(snapshot: Snapshot) -> int:
    """The device an analysis is about: the one with an OOM, else the largest pool, else 0."""
    devices = snapshot.devices()
    for device in devices:
        if snapshot.ooms(device):
            return device
    if not devices:
        return 0
    return max(devices, key=lambda d: reserved_bytes_at_snapshot(snapshot, d))
