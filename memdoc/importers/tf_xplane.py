"""Read TensorFlow profiler XSpace files (`*.xplane.pb`): allocator memory over time."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memdoc.errors import InputError
from memdoc.importers.build import TraceBuilder
from memdoc.importers.protobuf import FIXED64, fields, signed
from memdoc.trace.model import DeviceInfo, EventKind, Metric, SeriesKey

MAX_XSPACE_BYTES = 2 * 1024**3
HOST_DEVICE = -1
MEMORY_EVENTS = frozenset({"MemoryAllocation", "MemoryDeallocation"})
_GPU_ALLOCATOR = re.compile(r"^GPU_(?P<index>\d+)_bfc$")
Stat = int | float | str


@dataclass(frozen=True)
class MemoryEvent:
    """One MemoryAllocation/MemoryDeallocation event of the host plane, with its stats."""

    t_ns: int
    name: str
    stats: dict[str, Stat]


def looks_like_xspace(head: bytes) -> bool:
    # An XSpace starts with its first XPlane (field 1), whose name is "/host:..." or "/device:...".
    return head[:1] == b"\x0a" and (b"/host:" in head[:4096] or b"/device:" in head[:4096])


def memory_events(path: Path) -> list[MemoryEvent]:
    """The allocator events of an XSpace, in time order.

    Raises:
        InputError: not an XSpace, or too large.
    """
    if path.stat().st_size > MAX_XSPACE_BYTES:
        raise InputError(f"{path}: larger than any profile memdoc reads")
    events: list[MemoryEvent] = []
    for number, _, plane in fields(path.read_bytes()):
        if number == 1 and isinstance(plane, memoryview):
            events.extend(_plane_events(plane))
    return sorted(events, key=lambda e: e.t_ns)


def _plane_events(plane: memoryview) -> Iterator[MemoryEvent]:
    event_names: dict[int, str] = {}
    stat_names: dict[int, str] = {}
    lines: list[memoryview] = []
    for number, _, value in fields(plane):
        if not isinstance(value, memoryview):
            continue
        if number == 3:
            lines.append(value)
        elif number in (4, 5):
            key, name = _metadata_entry(value)
            (event_names if number == 4 else stat_names)[key] = name
    wanted = {k for k, name in event_names.items() if name in MEMORY_EVENTS}
    if not wanted:
        return
    for line in lines:
        yield from _line_events(line, wanted, event_names, stat_names)


def _metadata_entry(entry: memoryview) -> tuple[int, str]:
    """A map entry (key, XEventMetadata or XStatMetadata): its id and name."""
    key = 0
    name = ""
    for number, _, value in fields(entry):
        if number == 1 and isinstance(value, int):
            key = value
        elif number == 2 and isinstance(value, memoryview):
            for sub, _, sub_value in fields(value):
                if sub == 2 and isinstance(sub_value, memoryview):
                    name = bytes(sub_value).decode("utf-8", errors="replace")
    return key, name


def _line_events(
    line: memoryview, wanted: set[int], event_names: dict[int, str], stat_names: dict[int, str]
) -> Iterator[MemoryEvent]:
    start_ns = 0
    events: list[memoryview] = []
    for number, _, value in fields(line):
        if number == 3 and isinstance(value, int):
            start_ns = signed(value)
        elif number == 4 and isinstance(value, memoryview):
            events.append(value)
    for event in events:
        metadata = offset_ps = 0
        stats: dict[str, Stat] = {}
        for number, _, value in fields(event):
            if number == 1 and isinstance(value, int):
                metadata = value
            elif number == 2 and isinstance(value, int):
                offset_ps = signed(value)
            elif number == 4 and isinstance(value, memoryview):
                name, stat = _stat(value, stat_names)
                stats[name] = stat
        if metadata in wanted:
            yield MemoryEvent(start_ns + offset_ps // 1000, event_names[metadata], stats)


def _stat(message: memoryview, stat_names: dict[int, str]) -> tuple[str, Stat]:
    name = ""
    stat: Stat = 0
    for number, wire, value in fields(message):
        if number == 1 and isinstance(value, int):
            name = stat_names.get(value, str(value))
        elif number == 2 and wire == FIXED64 and isinstance(value, int):
            stat = struct.unpack("<d", value.to_bytes(8, "little"))[0]
        elif number in (3, 4) and isinstance(value, int):
            stat = signed(value) if number == 4 else value
        elif number == 5 and isinstance(value, memoryview):
            stat = bytes(value).decode("utf-8", errors="replace")
        elif number == 7 and isinstance(value, int):
            stat = stat_names.get(value, "")
    return name, stat


def allocator_device(allocator: str) -> int:
    """GPU_3_bfc -> 3; host allocators (gpu_host_bfc, cpu) -> the host index."""
    match = _GPU_ALLOCATOR.match(allocator)
    return int(match["index"]) if match else HOST_DEVICE


def import_xspace(path: Path, builder: TraceBuilder) -> None:
    """`tf.allocated`, `tf.limit` and `tf.largest_free` per allocator over time.

    In use = heap bytes allocated + stack bytes reserved; limit = in use + bytes available.
    """
    events = memory_events(path)
    if not events:
        raise InputError(f"{path}: a TensorFlow profile without memory events")
    seen: set[int] = set()
    for event in events:
        allocator = str(event.stats.get("allocator_name", ""))
        device = allocator_device(allocator)
        if device not in seen and device != HOST_DEVICE:
            builder.device(DeviceInfo(index=device, name=f"/device:GPU:{device}"))
        seen.add(device)
        builder.values(event.t_ns / 1e9, _values(event, device))
    builder.event(events[0].t_ns / 1e9, EventKind.FRAMEWORK, {"name": "tensorflow"})


def _values(event: MemoryEvent, device: int) -> dict[SeriesKey, int | None]:
    def number(name: str) -> int | None:
        value = event.stats.get(name)
        return int(value) if isinstance(value, (int, float)) else None

    heap, stack, available = (
        number("bytes_allocated"),
        number("bytes_reserved"),
        number("bytes_available"),
    )
    in_use = heap + (stack or 0) if heap is not None else None
    fragmentation = event.stats.get("fragmentation")
    largest = None
    if available is not None and isinstance(fragmentation, (int, float)):
        largest = round((1.0 - float(fragmentation)) * available)
    return {
        SeriesKey("tf." + Metric.ALLOCATED, device): in_use,
        SeriesKey("tf." + Metric.LIMIT, device): (
            in_use + available if in_use is not None and available is not None else None
        ),
        SeriesKey("tf." + Metric.LARGEST_FREE, device): largest,
    }
