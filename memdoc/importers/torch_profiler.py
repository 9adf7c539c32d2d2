"""Read PyTorch profiler outputs: Chrome traces with `[memory]` events, and memory timelines."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from memdoc.errors import InputError
from memdoc.importers.build import TraceBuilder
from memdoc.importers.safe_pickle import memory_budget_bytes
from memdoc.trace.model import DeviceInfo, EventKind, Metric, SeriesKey
from memdoc.units import format_bytes

MAX_JSON_BYTES = 2 * 1024**3  # decompressed; a profiler trace this large is not worth loading
# As for memdoc's own traces: a gzip that expands a hundred times more than a trace does is a
# bomb (or damage); small files may expand to the floor.
MAX_JSON_EXPANSION = 100
MIN_JSON_LIMIT_BYTES = 16 * 1024**2
# Objects and arrays (events, their args): tens of millions is no profile memdoc could draw.
MAX_JSON_OBJECTS = 20_000_000
_CHUNK_BYTES = 1024**2
# What one parsed object costs (a dict or list, its slot, a few small values), and what the
# text's strings and numbers cost per byte once parsed, rounded up from a real profile: 54 MB
# of JSON, 451 thousand objects, 161 MB once parsed (tests/fixtures/importers/torch-profiler-hta).
OBJECT_BYTES = 200
JSON_BYTES_FACTOR = 2
CUDA_DEVICE_TYPE = 1  # the `Device Type` of `[memory]` events (0 is the CPU)
HOST_DEVICE = -1
# export_memory_timeline's raw rows: [time_ns, action, bytes, category]; time -1 = before.
_PREEXISTING_TIME = -1
CATEGORIES = (
    "parameter",
    "optimizer_state",
    "input",
    "temporary",
    "activation",
    "gradient",
    "autograd_detail",
    "unknown",
)
_ALLOCATED = "torch." + Metric.ALLOCATED
_RESERVED = "torch." + Metric.RESERVED
_PEAK = "torch." + Metric.ALLOCATED_PEAK


def load_json(path: Path) -> Any:
    """JSON from a file that may be gzipped, in bounded memory: a gzip that expands past
    MAX_JSON_EXPANSION times its size, more than MAX_JSON_OBJECTS objects, or objects that
    would not fit in the memory left are refused before anything is parsed.

    Raises:
        InputError: not JSON, damaged gzip, a bomb, or too large once decompressed.
    """
    data = _read_bounded(path)
    _check_objects(path, data)
    try:
        return json.loads(data)
    except MemoryError:
        raise InputError(f"{path}: not enough memory to read it; nothing was imported") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: damaged JSON ({exc})") from None


def _read_bounded(path: Path) -> bytearray:
    """The file's bytes, decompressed when it is gzip, no more than its limit.

    Raises:
        InputError: unreadable, damaged gzip, or past the limit.
    """
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            size = os.fstat(raw.fileno()).st_size
            limit = _decompressed_limit(size) if gzipped else MAX_JSON_BYTES
            with gzip.GzipFile(fileobj=raw) if gzipped else raw as stream:
                data = _read_at_most(stream, limit + 1)
    except MemoryError:
        raise InputError(f"{path}: not enough memory to read it; nothing was imported") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read it ({exc})") from None
    if len(data) <= limit:
        return data
    if gzipped:
        raise InputError(
            f"{path}: refused: it decompresses to more than {format_bytes(limit)}, over "
            f"{MAX_JSON_EXPANSION} times its size (a gzip bomb, or damage); nothing was imported"
        )
    raise InputError(f"{path}: larger than any profiler trace memdoc reads")


def _read_at_most(stream: IO[bytes] | gzip.GzipFile, limit: int) -> bytearray:
    """Up to `limit` bytes, in chunks: memory grows with what is there, not with the limit."""
    data = bytearray()
    while len(data) < limit and (chunk := stream.read(min(_CHUNK_BYTES, limit - len(data)))):
        data += chunk
    return data


def _decompressed_limit(file_bytes: int) -> int:
    """A profiler trace compresses about ten times; small files may expand to the floor."""
    return min(MAX_JSON_BYTES, max(MIN_JSON_LIMIT_BYTES, MAX_JSON_EXPANSION * file_bytes))


def _check_objects(path: Path, data: bytearray) -> None:
    """Refuse JSON whose objects and arrays are too many, or would not fit in memory once
    parsed (every brace counts: one inside a string only makes the estimate safer).

    Raises:
        InputError: more than MAX_JSON_OBJECTS, or more memory than is left.
    """
    objects = data.count(b"{") + data.count(b"[")
    if objects > MAX_JSON_OBJECTS:
        raise InputError(
            f"{path}: refused: more than {MAX_JSON_OBJECTS:,} objects, more than any profiler "
            "trace memdoc reads (damage, or a file made to fill memory); nothing was imported"
        )
    needed = objects * OBJECT_BYTES + JSON_BYTES_FACTOR * len(data)
    budget = memory_budget_bytes()
    if needed > budget:
        raise InputError(
            f"{path}: refused: its {objects:,} objects would take about "
            f"{format_bytes(needed)} of memory, {format_bytes(budget)} is available; "
            "nothing was imported",
            hint="analyse it on a machine with more memory",
        )


def is_chrome_trace(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("traceEvents"), list)


def is_memory_timeline(data: Any) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(r, list) and len(r) == 4 for r in data[:100])
    )


def import_chrome_trace(data: Mapping[str, Any], path: Path, builder: TraceBuilder) -> None:
    """`torch.allocated` and `torch.reserved` per device from `[memory]` instant events."""
    memory = list(_memory_events(data["traceEvents"]))
    if not memory:
        raise InputError(
            f"{path}: a profiler trace without memory events",
            hint="profile with torch.profiler.profile(profile_memory=True)",
        )
    names = {d.get("id"): d for d in data.get("deviceProperties") or () if isinstance(d, dict)}
    for device in sorted({d for d, _, _ in memory}):
        if device != HOST_DEVICE:
            props = names.get(device, {})
            builder.device(
                DeviceInfo(
                    index=device,
                    name=str(props.get("name") or f"cuda:{device}"),
                    total_bytes=props.get("totalGlobalMem"),
                )
            )
    for device, t_us, args in memory:
        builder.values(
            t_us / 1e6,
            {
                SeriesKey(_ALLOCATED, device): args.get("Total Allocated"),
                SeriesKey(_RESERVED, device): args.get("Total Reserved"),
            },
        )
    start = min(t for _, t, _ in memory) / 1e6
    builder.event(start, EventKind.FRAMEWORK, {"name": "pytorch"})
    rank = (data.get("distributedInfo") or {}).get("rank")
    if isinstance(rank, int):
        builder.note(start, f"Profiler trace of rank {rank}.")


def _memory_events(events: Iterable[Any]) -> Iterator[tuple[int, float, Mapping[str, Any]]]:
    """(device, time in µs, args) of each `[memory]` event; CPU events go to the host index."""
    for event in events:
        if not isinstance(event, dict) or event.get("name") != "[memory]":
            continue
        args = event.get("args")
        ts = event.get("ts")
        if not isinstance(args, dict) or not isinstance(ts, (int, float)):
            continue
        if args.get("Device Type") == CUDA_DEVICE_TYPE:
            device = args.get("Device Id")
            if isinstance(device, int):
                yield device, float(ts), args
        else:
            yield HOST_DEVICE, float(ts), args


def import_memory_timeline(
    rows: list[Any], path: Path, builder: TraceBuilder, device: int = 0
) -> None:
    """Replay `export_memory_timeline` raw rows: `torch.allocated` over time, and the bytes of
    parameters, gradients and optimizer state at the peak (a `model_state` event).

    The file does not record its device: it is filed under `device` (0 unless told).
    """
    by_category = [0] * len(CATEGORIES)
    total = peak = 0
    peak_split: list[int] = list(by_category)
    points: dict[int, tuple[int, int]] = {}  # ms -> (last, highest)
    first_ns: int | None = None
    peak_ns: int | None = None
    for row in rows:
        t_ns, _action, size, category = _row(row, path)
        if t_ns != _PREEXISTING_TIME and first_ns is None:
            first_ns = t_ns
        when = first_ns if t_ns == _PREEXISTING_TIME else t_ns
        total += size
        by_category[category] += size
        if total > peak:
            peak, peak_split, peak_ns = total, list(by_category), when
        if when is not None:
            ms = when // 1_000_000
            points[ms] = (total, max(total, points.get(ms, (0, 0))[1]))
    if first_ns is None:
        raise InputError(f"{path}: a memory timeline without a single timed row")
    for ms, (last, highest) in sorted(points.items()):
        values = {SeriesKey(_ALLOCATED, device): last}
        if highest > last:
            values[SeriesKey(_PEAK, device)] = highest
        builder.values(ms / 1000, values)
    builder.device(DeviceInfo(index=device, name=f"cuda:{device}"))
    builder.event(
        (peak_ns if peak_ns is not None else first_ns) / 1e9,
        EventKind.MODEL_STATE,
        {
            "framework": "pytorch",
            "device": device,
            "param_bytes": peak_split[0],
            "optimizer_state_bytes": peak_split[1],
            "grad_bytes": peak_split[5],
            "categories_at_peak": dict(zip(CATEGORIES, peak_split, strict=True)),
            "phase": "peak",
        },
    )
    builder.note(
        first_ns / 1e9,
        f"Memory timeline of the PyTorch profiler: tensor bytes by category; the file does not "
        f"name its device, it is shown as device {device}.",
    )


def _row(row: Any, path: Path) -> tuple[int, int, int, int]:
    if (
        not isinstance(row, list)
        or len(row) != 4
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in row)
    ):
        raise InputError(f"{path}: a memory timeline row is not [time, action, bytes, category]")
    t_ns, action, size, category = row
    if not 0 <= category < len(CATEGORIES):
        category = len(CATEGORIES) - 1
    return t_ns, action, size, category
