"""The single, append-only trace writer: line records, flushed at least once a second."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO

from memdoc.errors import MemdocError
from memdoc.files import open_output_text
from memdoc.trace import codec
from memdoc.trace.model import (
    CollectorStatus,
    DeviceInfo,
    Event,
    ExitInfo,
    Header,
    ProcessInfo,
    SeriesKey,
)

FLUSH_INTERVAL_S = 0.5
# Events that must reach the disk at once: the process may die right after them.
_URGENT_EVENTS = frozenset({"oom", "oom_suspect", "exception", "process_exit"})


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TraceWriter:
    """Writes one trace file. Thread-safe; a write error disables it instead of raising.

    Times given to the writer are absolute (`time.time()`); records store them relative to
    the header's `created_unix`.
    """

    def __init__(self, path: str | os.PathLike[str], header: Header, *, force: bool = False):
        self.path = Path(path)
        self.header = header
        self.error: str | None = None
        self.values_written = 0
        self._lock = threading.Lock()
        self._series: dict[SeriesKey, int] = {}
        self._last_flush = time.monotonic()
        self._closed = False
        if self.path.parent and not self.path.parent.exists():
            raise MemdocError(f"cannot write the trace: folder {self.path.parent} does not exist")
        self._file: IO[str] = open_output_text(self.path, force=force)
        self._write_line(codec.encode_header(header))
        self._flush()

    @property
    def start_unix(self) -> float:
        return self.header.created_unix

    def rel(self, unix_t: float) -> float:
        return unix_t - self.header.created_unix

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        """Record values taken at one instant. None values are not recorded (missing, not 0)."""
        if not values:
            return
        with self._lock:
            pairs: list[tuple[int, int | float]] = []
            for key, value in values.items():
                if not _is_number(value):
                    continue  # missing or not a number: never recorded as a value
                sid = self._series.get(key)
                if sid is None:
                    sid = len(self._series)
                    self._series[key] = sid
                    self._write_line(codec.encode_series(sid, key))
                pairs.append((sid, value))
            if pairs:
                self._write_line(codec.encode_samples(self.rel(unix_t), pairs))
                self.values_written += len(pairs)
            self._maybe_flush()

    def event(self, event: Event) -> None:
        """Record an event; `event.t` is absolute. Urgent kinds are flushed at once."""
        with self._lock:
            rel_event = Event(t=self.rel(event.t), kind=event.kind, pid=event.pid, data=event.data)
            try:
                line = codec.encode_event(rel_event)
            except (TypeError, ValueError):
                # Data that JSON cannot hold (a NaN, an object): keep the event, drop the data.
                line = codec.encode_event(Event(t=rel_event.t, kind=event.kind, pid=event.pid))
            self._write_line(line)
            if event.kind in _URGENT_EVENTS:
                self._flush()
            else:
                self._maybe_flush()

    def device(self, device: DeviceInfo) -> None:
        with self._lock:
            self._write_line(codec.encode_device(device))

    def devices(self, devices: Iterable[DeviceInfo]) -> None:
        for device in devices:
            self.device(device)

    def process(self, process: ProcessInfo) -> None:
        with self._lock:
            rel = replace(process, t=self.rel(process.t))
            self._write_line(codec.encode_process(rel))

    def collector(self, status: CollectorStatus) -> None:
        with self._lock:
            rel = CollectorStatus(
                name=status.name,
                available=status.available,
                t=self.rel(status.t) if status.t else 0.0,
                pid=status.pid,
                reason=status.reason,
                hint=status.hint,
                version=status.version,
            )
            self._write_line(codec.encode_collector(rel))
            self._maybe_flush()

    def flush_if_due(self) -> None:
        with self._lock:
            self._maybe_flush()

    def close(self, end: ExitInfo | None = None) -> None:
        """Write the end record (absolute time in `end.t`) and close. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            if end is not None:
                rel_end = ExitInfo(
                    t=self.rel(end.t),
                    exit_code=end.exit_code,
                    signal=end.signal,
                    reason=end.reason,
                )
                self._write_line(codec.encode_end(rel_end))
            self._flush()
            self._closed = True
            try:
                self._file.close()
            except OSError as exc:
                self._fail(exc)

    # -- internals (called with the lock held) -------------------------------------------

    def _write_line(self, line: str) -> None:
        if self.error is not None or self._closed:
            return
        try:
            self._file.write(line)
            self._file.write("\n")
        except OSError as exc:
            self._fail(exc)

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self._flush()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        if self.error is not None or self._closed:
            return
        try:
            self._file.flush()
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        # A full disk must not take the program down: stop writing, remember why.
        self.error = f"writing {self.path} failed: {exc.strerror or exc}; the trace stops here"
