"""Turn a PyTorch memory snapshot into trace records: totals over time, OOMs, settings."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from memdoc.importers.build import TraceBuilder
from memdoc.importers.fragmentation import pool_state
from memdoc.importers.snapshot_replay import Replay, replay
from memdoc.importers.torch_snapshot import Snapshot, TraceEntry, read_snapshot
from memdoc.kinds import OomKind
from memdoc.trace.model import DeviceInfo, EventKind, Metric, OomInfo, SeriesKey
from memdoc.units import format_bytes

FRAMEWORK = "pytorch"
_ALLOCATED = SeriesKey("torch." + Metric.ALLOCATED)
_RESERVED = SeriesKey("torch." + Metric.RESERVED)
_PEAK = SeriesKey("torch." + Metric.ALLOCATED_PEAK)
# PyTorch writes SIZE_MAX (read back as -1 or a huge number) when max_split_size is unset.
_UNLIMITED_SPLIT_BYTES = 1 << 62


def import_snapshot(path: Path, builder: TraceBuilder) -> None:
    """Read a snapshot pickle safely and add what it tells to `builder`.

    Raises:
        RefusedPickle, NotASnapshot: see `read_snapshot`.
    """
    snapshot = read_snapshot(path)
    start_s = _start_s(snapshot, path)
    end_s = start_s
    for device in snapshot.devices() or [0]:
        builder.device(DeviceInfo(index=device, name=f"cuda:{device}"))
        end_s = max(end_s, _add_device(snapshot, device, start_s, builder))
    builder.event(start_s, EventKind.ALLOCATOR_CONFIG, allocator_config(snapshot))
    _add_annotations(snapshot, builder)
    reason = "oom" if any(snapshot.ooms(d) for d in snapshot.devices()) else "import"
    builder.event(end_s, EventKind.SNAPSHOT, {"path": str(path), "reason": reason})
    for text in _notes(snapshot):
        builder.note(end_s, text)


def _add_annotations(snapshot: Snapshot, builder: TraceBuilder) -> None:
    """`record_function` regions the snapshot kept (`external_annotations`) become marks."""
    for annotation in snapshot.annotations:
        time_us = annotation.get("time_us")
        name = annotation.get("name")
        if annotation.get("stage") != "START" or not isinstance(time_us, int) or not name:
            continue
        data: dict[str, Any] = {"label": str(name), "source": "snapshot"}
        device = annotation.get("device")
        if isinstance(device, int):
            data["device"] = device
        builder.event(time_us / 1e6, EventKind.MARK, data)


def _start_s(snapshot: Snapshot, path: Path) -> float:
    """Unix time of the first trace entry; without times, when the file was written."""
    times = [e.time_us for entries in snapshot.traces.values() for e in entries if e.time_us]
    if times:
        return min(times) / 1e6
    return path.stat().st_mtime


def _add_device(snapshot: Snapshot, device: int, start_s: float, builder: TraceBuilder) -> float:
    """Series and OOM events of one device; returns the snapshot moment (unix seconds)."""
    curve = replay(snapshot, device)
    end_s = start_s
    for t_s, values in _timeline(curve):
        builder.values(t_s, {SeriesKey(k.metric, device): v for k, v in values.items()})
        end_s = t_s
    total = pool_state("all pools", snapshot.segments_on(device))
    moment = {
        Metric.ACTIVE: total.allocated_bytes + total.pending_free_bytes,
        Metric.INACTIVE_SPLIT: total.inactive_split_bytes,
        Metric.LARGEST_FREE: total.largest_free_bytes,
    }
    if end_s == start_s and not any(e.time_us for e in curve.entries):
        # Without times the snapshot moment is all there is; the timeline ends on it otherwise.
        moment[Metric.ALLOCATED] = total.allocated_bytes
        moment[Metric.RESERVED] = total.reserved_bytes
    builder.values(end_s, {SeriesKey("torch." + m, device): v for m, v in moment.items()})
    for index, entry in enumerate(curve.entries):
        if entry.action == "oom":
            t_s = entry.time_us / 1e6 if entry.time_us else end_s
            builder.event(t_s, EventKind.OOM, _oom_data(entry, device, curve, index))
    return end_s


def _timeline(curve: Replay) -> Iterator[tuple[float, dict[SeriesKey, int]]]:
    """Values per millisecond (the trace's resolution): the last, and the peak when higher."""
    entries = curve.entries
    if not any(e.time_us for e in entries):
        return
    time_us = next(e.time_us for e in entries if e.time_us)
    bucket = time_us // 1000
    peak = curve.allocated[0]
    for i, entry in enumerate(entries, start=1):
        time_us = entry.time_us or time_us
        if time_us // 1000 != bucket:
            yield _point(curve, i - 1, bucket, peak)
            bucket = time_us // 1000
            peak = curve.allocated[i - 1]
        peak = max(peak, curve.allocated[i])
    yield _point(curve, len(entries), bucket, peak)


def _point(
    curve: Replay, index: int, bucket_ms: int, peak: int
) -> tuple[float, dict[SeriesKey, int]]:
    values = {_ALLOCATED: curve.allocated[index], _RESERVED: curve.reserved[index]}
    if peak > curve.allocated[index]:
        values[_PEAK] = peak
    return bucket_ms / 1000, values


def _oom_data(entry: TraceEntry, device: int, curve: Replay, index: int) -> dict[str, Any]:
    requested = entry.size_bytes
    free = entry.device_free_bytes
    message = f"CUDA out of memory. Tried to allocate {format_bytes(requested)}"
    if free is not None:
        message += f"; {format_bytes(free)} free on the device"
    oom = OomInfo(
        framework=FRAMEWORK,
        kind=OomKind.ALLOCATOR,
        message=message + " (from the allocator trace of a memory snapshot)",
        device=device,
        device_type="gpu",
        requested_bytes=requested,
        free_bytes=free,
        allocated_bytes=curve.allocated[index],
        reserved_bytes=curve.reserved[index],
        allocator="native",
    )
    stack = [str(frame) for frame in reversed(entry.frames)]
    return {"oom": oom.to_dict(), "stack": stack, "source": "snapshot"}


def allocator_config(snapshot: Snapshot) -> dict[str, Any]:
    """The `allocator_config` event data a snapshot supports."""
    settings: Mapping[str, Any] = snapshot.allocator_settings
    data: dict[str, Any] = {"framework": FRAMEWORK}
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    if isinstance(conf, str) and conf:
        data["alloc_conf"] = conf
    data["backend"] = "cudaMallocAsync" if "cudaMallocAsync" in str(conf or "") else "native"
    if snapshot.expandable_segments is not None:
        data["expandable_segments"] = snapshot.expandable_segments
    split = settings.get("max_split_size")
    if isinstance(split, int) and 0 < split < _UNLIMITED_SPLIT_BYTES:
        data["max_split_size_bytes"] = split
    threshold = settings.get("garbage_collection_threshold")
    if isinstance(threshold, (int, float)) and threshold > 0:
        data["garbage_collection_threshold"] = float(threshold)
    return data


def _notes(snapshot: Snapshot) -> list[str]:
    notes: list[str] = []
    entries = [e for trace in snapshot.traces.values() for e in trace]
    if snapshot.era == "history":
        notes.append(
            "PyTorch 2.0 snapshot (blocks carry 'history'): no allocator settings and no "
            "times were recorded."
        )
    if len(entries) <= 1 and not any(e.action == "oom" for e in entries):
        notes.append(
            "The snapshot's allocator trace holds at most one entry (history recorded with a "
            "one-entry buffer, as the legacy _record_memory_history(True) does): the file cannot "
            "tell whether it was taken at an OOM, nor what a failing request asked for."
        )
    elif entries and not any(e.time_us for e in entries):
        notes.append("The allocator trace has no times: memory over time cannot be drawn.")
    if not snapshot.segments:
        notes.append("The snapshot holds no segments: nothing was allocated on the GPU.")
    return notes
