"""Encode and decode trace records: one JSON value per line, the one place that knows the format."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields, replace
from typing import Any

from memdoc.trace.model import (
    FORMAT_NAME,
    CollectorStatus,
    DeviceInfo,
    Event,
    ExitInfo,
    Header,
    ProcessInfo,
    SeriesKey,
)

# Record tags. Sample rows are JSON arrays `[t, sid, value, sid, value, ...]`;
# every other record is an object with a "type".
T_HEADER = "header"
T_SERIES = "series"
T_EVENT = "event"
T_DEVICE = "device"
T_PROCESS = "process"
T_COLLECTOR = "collector"
T_END = "end"

_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_DUMPS_ASCII = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode
# A lone surrogate: a byte that was not UTF-8 in an argument, a folder or an environment value
# (Python holds it as U+DC80..U+DCFF), or a damaged string. UTF-8 cannot hold it; a JSON
# escape can, and reads back as the same string.
_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> str:
    """Compact JSON; NaN and infinities are a bug upstream, so they raise. Text that is not
    valid Unicode is kept losslessly, as JSON `\\uXXXX` escapes."""
    line = _DUMPS(value)
    return _DUMPS_ASCII(value) if _SURROGATE.search(line) else line


def round_t(t: float) -> float:
    """Times are stored to the millisecond: finer is noise for memory sampling."""
    return round(t, 3)


def encode_header(header: Header) -> str:
    data = asdict(header)
    data["command"] = list(header.command)
    data["env"] = dict(header.env)
    if header.cgroup_version is None:
        del data["cgroup_version"]  # added later: headers without it stay as they were
    if header.node_rank is None:
        del data["node_rank"]  # a one-node recording's header is as it always was
    if header.run_id is None:
        del data["run_id"]  # no launcher named the job: the header is as it always was
    return dumps({"type": T_HEADER, "format": FORMAT_NAME, **data})


def encode_series(series_id: int, key: SeriesKey) -> str:
    record: dict[str, Any] = {"type": T_SERIES, "id": series_id, "metric": key.metric}
    if key.device is not None:
        record["device"] = key.device
    if key.pid is not None:
        record["pid"] = key.pid
    return dumps(record)


def encode_samples(t: float, pairs: list[tuple[int, int | float]]) -> str:
    row: list[int | float] = [round_t(t)]
    for series_id, value in pairs:
        row.append(series_id)
        row.append(value)
    return dumps(row)


def encode_event(event: Event) -> str:
    record: dict[str, Any] = {"type": T_EVENT, "t": round_t(event.t), "kind": event.kind}
    if event.pid is not None:
        record["pid"] = event.pid
    if event.data:
        record["data"] = dict(event.data)
    return dumps(record)


def encode_device(device: DeviceInfo) -> str:
    return dumps({"type": T_DEVICE, **_known(asdict(device))})


def encode_process(process: ProcessInfo) -> str:
    data = asdict(process)
    data["command"] = list(process.command)
    data["t"] = round_t(process.t)
    return dumps({"type": T_PROCESS, **_known(data)})


def encode_collector(status: CollectorStatus) -> str:
    data = asdict(status)
    data["t"] = round_t(status.t)
    return dumps({"type": T_COLLECTOR, **_known(data)})


def encode_end(end: ExitInfo) -> str:
    return dumps({"type": T_END, **_known(asdict(end))})


def _known(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


_MAX_ABS_NUMBER = 1e15  # times and sizes beyond this are damage, not data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63


def _is_float(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < _MAX_ABS_NUMBER
    )


def is_time(value: Any) -> bool:
    """A finite number of seconds that a run could last (NaN or 1e300 is damage)."""
    return _is_float(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


_SCALAR_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "float": _is_float,
    "str": _is_str,
    "bool": _is_bool,
}


def _build(cls: type[Any], record: Mapping[str, Any]) -> Any:
    """The dataclass from a record, every scalar field of the type it declares.

    Raises:
        ValueError: a field holds a value of another type (a damaged or hostile file).
    """
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in record:
            continue
        value = record[f.name]
        declared = str(f.type)
        optional = declared.endswith(" | None")
        check = _SCALAR_CHECKS.get(declared.removesuffix(" | None"))
        if check is not None:
            if value is None and not optional:
                raise ValueError(f"{f.name} is missing")
            if value is not None and not check(value):
                raise ValueError(f"{f.name} has the wrong type")
        kwargs[f.name] = value
    return cls(**kwargs)


def decode_header(record: Mapping[str, Any]) -> Header:
    header: Header = _build(Header, record)
    if not 0 <= header.created_unix < 1e11:
        raise ValueError("created_unix is not a time")
    env = record.get("env")
    return Header(
        **{
            **{f.name: getattr(header, f.name) for f in fields(Header)},
            "command": tuple(str(c) for c in record.get("command") or ()),
            "env": {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        }
    )


def decode_series(record: Mapping[str, Any]) -> tuple[int, SeriesKey]:
    device = record.get("device")
    pid = record.get("pid")
    return int(record["id"]), SeriesKey(
        metric=str(record["metric"]),
        device=int(device) if device is not None else None,
        pid=int(pid) if pid is not None else None,
    )


def decode_event(record: Mapping[str, Any]) -> Event:
    return Event(*decode_event_fields(record))


def decode_event_fields(record: Mapping[str, Any]) -> tuple[float, str, int | None, dict[str, Any]]:
    """An event's t, kind, pid and data, for a reader that keeps them without the `Event`."""
    data = record.get("data")
    pid = record.get("pid")
    t = float(record["t"])
    if not _is_float(t):
        raise ValueError("t is not a time")
    return (
        t,
        str(record["kind"]),
        int(pid) if pid is not None else None,
        (data if isinstance(data, dict) else {}),
    )


def decode_device(record: Mapping[str, Any]) -> DeviceInfo:
    device: DeviceInfo = _build(DeviceInfo, record)
    return device


def decode_process(record: Mapping[str, Any]) -> ProcessInfo:
    process: ProcessInfo = _build(ProcessInfo, record)
    return replace(process, command=tuple(str(c) for c in record.get("command") or ()))


def decode_collector(record: Mapping[str, Any]) -> CollectorStatus:
    status: CollectorStatus = _build(CollectorStatus, record)
    return status


def decode_end(record: Mapping[str, Any]) -> ExitInfo:
    end: ExitInfo = _build(ExitInfo, record)
    return end
