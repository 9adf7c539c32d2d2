"""Read PyTorch profiler outputs: Chrome traces with `[memory]` events, and memory timelines."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from memdoc.errors import InputError
from memdoc.importers.build import TraceBuilder
from memdoc.trace.model import DeviceInfo, EventKind, Metric, SeriesKey

MAX_JSON_BYTES = 2 * 1024**3  # decompressed; a profiler trace this large is not worth loading
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
    """JSON from a file that may be gzipped, refusing absurd sizes.

    Raises:
        InputError: not JSON, damaged gzip, or larger than MAX_JSON_BYTES once decompressed.
    """
    try:
        with _open(path) as stream:
            data = stream.read(MAX_JSON_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise InputError(f"{path}: cannot read it ({exc})") from None
    if len(data) > MAX_JSON_BYTES:
        raise InputError(f"{path}: larger than any profiler trace memdoc reads")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise InputError(f"{path}: damaged JSON ({exc})") from None


def _open(path: Path) -> Any:
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


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
