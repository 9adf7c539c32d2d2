"""Build an in-memory trace from what importers read, and save it as a trace file atomically."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from memdoc.errors import MemdocError, OutputExistsError
from memdoc.files import refuse_foreign_link, temporary_beside
from memdoc.trace.model import (
    SCHEMA_VERSION,
    DeviceInfo,
    Event,
    EventKind,
    Header,
    ProcessInfo,
    SeriesKey,
)
from memdoc.trace.reader import Trace
from memdoc.trace.writer import TraceWriter
from memdoc.version import __version__

IMPORT_MODE = "import"
# Names importers give a device when their file does not say what it is.
_PLACEHOLDER_NAME = re.compile(r"^(cuda:\d+|GPU \d+|JAX device \d+|/device:GPU:\d+)$")


class TraceBuilder:
    """Collects values, events, devices and processes at absolute (unix) times.

    Files from several tools about one run go into one builder; `build()` starts the trace
    at the earliest time seen, so that they line up by wall clock.
    """

    def __init__(self) -> None:
        self._values: dict[SeriesKey, list[tuple[float, float]]] = {}
        self._events: list[Event] = []
        self._devices: dict[int, DeviceInfo] = {}
        self._processes: dict[int, ProcessInfo] = {}
        self._earliest: float | None = None

    @property
    def empty(self) -> bool:
        return not (self._values or self._events or self._devices)

    def _seen(self, t_unix: float) -> None:
        if self._earliest is None or t_unix < self._earliest:
            self._earliest = t_unix

    def values(self, t_unix: float, values: Mapping[SeriesKey, int | float | None]) -> None:
        """Values taken at one instant; None is missing and not recorded."""
        recorded = False
        for key, value in values.items():
            if value is None:
                continue
            self._values.setdefault(key, []).append((t_unix, float(value)))
            recorded = True
        if recorded:
            self._seen(t_unix)

    def event(
        self,
        t_unix: float,
        kind: str,
        data: Mapping[str, Any] | None = None,
        pid: int | None = None,
    ) -> None:
        self._events.append(Event(t=t_unix, kind=kind, pid=pid, data=dict(data or {})))
        self._seen(t_unix)

    def note(self, t_unix: float, text: str) -> None:
        """A note for the reader; the same text is noted once."""
        if any(e.kind == EventKind.NOTE and e.data.get("text") == text for e in self._events):
            return
        self.event(t_unix, EventKind.NOTE, {"text": text})

    def device(self, device: DeviceInfo) -> None:
        """A device; a later description of the same index fills in what the first lacked."""
        known = self._devices.get(device.index)
        if known is not None:
            parent = known.parent_index if known.parent_index is not None else device.parent_index
            device = DeviceInfo(
                index=device.index,
                name=device.name if _PLACEHOLDER_NAME.match(known.name) else known.name,
                total_bytes=known.total_bytes or device.total_bytes,
                uuid=known.uuid or device.uuid,
                parent_index=parent,
                driver_version=known.driver_version or device.driver_version,
            )
        self._devices[device.index] = device

    def process(self, pid: int, t_unix: float, command: tuple[str, ...], *, ours: bool) -> None:
        if pid not in self._processes:
            self._processes[pid] = ProcessInfo(pid=pid, t=t_unix, command=command, ours=ours)
            self._seen(t_unix)

    def build(self) -> Trace:
        """The trace, with times relative to the earliest instant recorded."""
        start = self._earliest if self._earliest is not None else 0.0
        header = Header(
            version=SCHEMA_VERSION,
            created_unix=start,
            memdoc_version=__version__,
            mode=IMPORT_MODE,
        )
        trace = Trace(header)
        for device in sorted(self._devices.values(), key=lambda d: d.index):
            trace.add_device(device)
        for process in self._processes.values():
            trace.add_process(_shifted_process(process, start))
        for key, points in self._values.items():
            for t, value in sorted(points, key=lambda p: p[0]):
                trace.add_values(t - start, [(key, value)])
        for event in sorted(self._events, key=lambda e: e.t):
            trace.add_event(
                Event(t=event.t - start, kind=event.kind, pid=event.pid, data=event.data)
            )
        return trace


def _shifted_process(process: ProcessInfo, start: float) -> ProcessInfo:
    return ProcessInfo(
        pid=process.pid,
        t=process.t - start,
        ppid=process.ppid,
        command=process.command,
        ours=process.ours,
        user=process.user,
    )


def save_trace(trace: Trace, path: str | os.PathLike[str], *, force: bool = False) -> None:
    """Write `trace` as a trace file: to a temporary file first, renamed at the end, so that a
    failure never leaves a partial output.

    Raises:
        OutputExistsError: `path` exists and `force` is false.
        MemdocError: the folder does not exist or cannot be written.
    """
    out = Path(path)
    if out.exists() and not force:
        raise OutputExistsError(str(out))
    refuse_foreign_link(out)
    fd, tmp = temporary_beside(out)
    os.close(fd)
    try:
        _write(trace, tmp, out.parent)
        os.replace(tmp, out)
    except OSError as exc:
        raise MemdocError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _write(trace: Trace, path: Path, folder: Path) -> None:
    writer = TraceWriter(path, trace.header, force=True)
    t0 = trace.header.created_unix
    try:
        writer.devices(trace.devices_by_index[i] for i in sorted(trace.devices_by_index))
        for process in trace.processes():
            writer.process(_shifted_process(process, -t0))
        for t, values in _instants(trace):
            writer.samples(t0 + t, values)
        for event in trace.iter_events():
            data = _relative_snapshot(event, folder)
            writer.event(Event(t=t0 + event.t, kind=event.kind, pid=event.pid, data=data))
    finally:
        writer.close()
    if writer.error is not None:
        raise MemdocError(writer.error)


def _relative_snapshot(event: Event, folder: Path) -> Mapping[str, Any]:
    """A snapshot event's path, relative to the trace (the trace format says so)."""
    path = event.data.get("path")
    if event.kind != EventKind.SNAPSHOT or not isinstance(path, str):
        return event.data
    try:
        relative = os.path.relpath(Path(path).resolve(), folder.resolve())
    except ValueError:  # another drive on Windows: keep it absolute
        return event.data
    return {**event.data, "path": relative}


def _instants(trace: Trace) -> Iterator[tuple[float, dict[SeriesKey, int | float]]]:
    """Values grouped by instant, in time order; whole numbers written as integers."""
    rows: list[tuple[float, int, SeriesKey, float]] = []
    for order, key in enumerate(trace.series_keys()):
        series = trace.series(key.metric, key.device, key.pid)
        if series is not None:
            rows.extend(
                (t, order, key, v) for t, v in zip(series.times, series.values, strict=True)
            )
    rows.sort(key=lambda row: (row[0], row[1]))
    current: dict[SeriesKey, int | float] = {}
    current_t = 0.0
    for t, _, key, value in rows:
        if current and (t != current_t or key in current):
            yield current_t, current
            current = {}
        current_t = t
        current[key] = int(value) if value.is_integer() else value
    if current:
        yield current_t, current
