"""Read JAX device memory profiles (`jax.profiler.device_memory_profile()`: gzipped pprof)."""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from memdoc.errors import InputError
from memdoc.importers.build import TraceBuilder
from memdoc.importers.holders import Holders, holders
from memdoc.importers.protobuf import LENGTH_DELIMITED, fields, packed_varints, signed
from memdoc.importers.snapshot_replay import Live
from memdoc.importers.torch_snapshot import Frame, Stack
from memdoc.trace.model import DeviceInfo, Metric, SeriesKey

HOST_DEVICE = -1  # the trace's index for a framework's CPU device
MAX_PROFILE_BYTES = 512 * 1024 * 1024  # decompressed; real profiles are kilobytes to megabytes
_DEVICE_RE = re.compile(r"^(?P<kind>[a-z]+):(?P<index>\d+)$", re.IGNORECASE)


@dataclass
class PprofSample:
    """One pprof sample: its values by sample type, string labels, and its stack."""

    values: dict[str, int]
    labels: dict[str, str]
    stack: Stack


@dataclass
class _Tables:
    strings: list[str] = field(default_factory=list)
    functions: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> name, file
    locations: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # id -> lines
    sample_types: list[int] = field(default_factory=list)
    raw_samples: list[memoryview] = field(default_factory=list)


def read_pprof(path: Path) -> list[PprofSample]:
    """Samples of a (gzipped) pprof profile.

    Raises:
        InputError: not gzip, not a pprof profile, or implausibly large once decompressed.
    """
    data = _decompress(path)
    tables = _Tables()
    for number, wire, value in fields(data):
        if wire != LENGTH_DELIMITED or not isinstance(value, memoryview):
            continue
        if number == 1:
            tables.sample_types.append(_sample_type(value))
        elif number == 2:
            tables.raw_samples.append(value)
        elif number == 4:
            _location(value, tables)
        elif number == 5:
            _function(value, tables)
        elif number == 6:
            tables.strings.append(bytes(value).decode("utf-8", errors="replace"))
    if "space" not in [_string(tables, i) for i in tables.sample_types]:
        raise InputError(f"{path}: a pprof profile without a 'space' sample type (not memory)")
    return [_sample(raw, tables) for raw in tables.raw_samples]


def _decompress(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw
    stream = zlib.decompressobj(wbits=31)
    try:
        data = stream.decompress(raw, MAX_PROFILE_BYTES)
    except zlib.error as exc:
        raise InputError(f"{path}: damaged gzip data ({exc})") from None
    if stream.unconsumed_tail:
        raise InputError(f"{path}: decompresses to more than any memory profile holds")
    return data


def _string(tables: _Tables, index: int) -> str:
    return tables.strings[index] if 0 <= index < len(tables.strings) else ""


def _sample_type(message: memoryview) -> int:
    for number, _, value in fields(message):
        if number == 1 and isinstance(value, int):
            return value
    return 0


def _function(message: memoryview, tables: _Tables) -> None:
    ident = name = filename = 0
    for number, _, value in fields(message):
        if isinstance(value, int):
            if number == 1:
                ident = value
            elif number == 2:
                name = value
            elif number == 4:
                filename = value
    tables.functions[ident] = (name, filename)


def _location(message: memoryview, tables: _Tables) -> None:
    ident = 0
    lines: list[tuple[int, int]] = []
    for number, _, value in fields(message):
        if number == 1 and isinstance(value, int):
            ident = value
        elif number == 4 and isinstance(value, memoryview):
            function = line = 0
            for sub, _, sub_value in fields(value):
                if sub == 1 and isinstance(sub_value, int):
                    function = sub_value
                elif sub == 2 and isinstance(sub_value, int):
                    line = signed(sub_value)
            lines.append((function, line))
    # pprof lists inlined frames callee first, as the stack is listed: keep that order.
    tables.locations[ident] = lines


def _sample(message: memoryview, tables: _Tables) -> PprofSample:
    location_ids: list[int] = []
    values: list[int] = []
    labels: dict[str, str] = {}
    for number, wire, value in fields(message):
        if number == 1:
            location_ids.extend(_ints(wire, value))
        elif number == 2:
            values.extend(signed(v) for v in _ints(wire, value))
        elif number == 3 and isinstance(value, memoryview):
            key = text = 0
            for sub, _, sub_value in fields(value):
                if sub == 1 and isinstance(sub_value, int):
                    key = sub_value
                elif sub == 2 and isinstance(sub_value, int):
                    text = sub_value
            labels[_string(tables, key)] = _string(tables, text)
    names = [_string(tables, t) for t in tables.sample_types]
    frames: list[Frame] = []
    for location in location_ids:
        for function, line in tables.locations.get(location, ()):
            name, filename = tables.functions.get(function, (0, 0))
            frames.append(Frame(_string(tables, filename), line, _string(tables, name)))
    return PprofSample(dict(zip(names, values, strict=False)), labels, tuple(frames))


def _ints(wire: int, value: int | memoryview) -> Iterable[int]:
    if isinstance(value, memoryview):
        return packed_varints(value)
    return [value]


def device_index(label: str) -> int | None:
    """'cuda:1' / 'gpu:1' / 'tpu:1' -> 1; 'cpu:0' -> the host index (-1)."""
    match = _DEVICE_RE.match(label.strip())
    if match is None:
        return None
    return HOST_DEVICE if match["kind"].lower() == "cpu" else int(match["index"])


def buffer_bytes_by_device(samples: Iterable[PprofSample]) -> dict[int, int]:
    """Live buffer bytes per device (compiled executables are not counted)."""
    totals: dict[int, int] = {}
    for sample in samples:
        if sample.labels.get("kind", "buffer") != "buffer":
            continue
        device = device_index(sample.labels.get("device", ""))
        if device is not None:
            totals[device] = totals.get(device, 0) + sample.values.get("space", 0)
    return totals


def jax_holders(samples: Iterable[PprofSample], device: int | None = None) -> Holders:
    """Who holds the live buffers (on one device, or all), by the program's own line."""
    live = [
        Live(s.values.get("space", 0), s.stack)
        for s in samples
        if s.labels.get("kind", "buffer") == "buffer"
        and (device is None or device_index(s.labels.get("device", "")) == device)
    ]
    return holders(live, "profile")


def import_jax_profile(path: Path, builder: TraceBuilder) -> None:
    """`jax.allocated` per device at the moment the profile was taken (the file's time)."""
    try:
        samples = read_pprof(path)
    except (gzip.BadGzipFile, EOFError) as exc:
        raise InputError(f"{path}: damaged profile ({exc})") from None
    t = path.stat().st_mtime
    totals = buffer_bytes_by_device(samples)
    for device in sorted(totals):
        name = "JAX CPU" if device == HOST_DEVICE else f"JAX device {device}"
        if device != HOST_DEVICE:
            builder.device(DeviceInfo(index=device, name=name))
        builder.values(t, {SeriesKey("jax." + Metric.ALLOCATED, device): totals[device]})
    builder.event(t, "framework", {"name": "jax"})
    builder.note(
        t,
        "JAX device memory profile: live buffers at one moment; the time is the file's "
        "modification time, as the profile records none.",
    )
