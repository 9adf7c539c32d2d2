"""Follow a trace while it is written: read only the complete lines appended since last time."""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path

from memdoc.errors import TraceError
from memdoc.trace.model import SeriesKey
from memdoc.trace.reader import (
    MAX_LINE_BYTES,
    RECORD_ERRORS,
    Series,
    Trace,
    apply_record,
    load_trace,
    parse_header_line,
)

_GZIP_MAGIC = b"\x1f\x8b"
# What one poll reads at most, so that catching up with a large trace stays responsive.
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024


class TraceTail:
    """An incremental reader of one trace file.

    Each `poll` reopens the file (on NFS only a fresh open sees what another node appended),
    reads from the remembered offset, applies every complete line to `trace` and keeps a
    cut last line for the next poll. A damaged line is counted and skipped, never raised.
    """

    def __init__(self, path: str | os.PathLike[str], *, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.path = Path(path)
        self.chunk_bytes = chunk_bytes
        self.trace: Trace | None = None
        self.damaged_lines = 0
        self.restarts = 0
        self._offset = 0
        self._pending = b""
        self._ids: dict[int, SeriesKey] = {}
        self._skipping_long_line = False
        self._fatal: TraceError | None = None

    @property
    def exists(self) -> bool:
        return self.trace is not None

    @property
    def caught_up(self) -> bool:
        """True when the last poll read everything the file held."""
        try:
            return self.path.stat().st_size <= self._offset
        except OSError:
            return True

    def poll(self) -> int:
        """Read what was appended; return how many records were applied.

        A file that does not exist yet reads as nothing new.

        Raises:
            TraceError: the file is not a memdoc trace, or is of a newer version.
        """
        if self._fatal is not None:
            raise self._fatal
        try:
            with open(self.path, "rb") as stream:
                if self._offset == 0 and stream.read(2) == _GZIP_MAGIC:
                    return self._load_compressed()
                size = os.fstat(stream.fileno()).st_size
                if size < self._offset:
                    self._restart()  # the file was replaced (a new run with --force)
                stream.seek(self._offset)
                data = stream.read(self.chunk_bytes)
        except FileNotFoundError:
            return 0
        except IsADirectoryError:
            raise TraceError(f"{self.path}: is a folder, not a trace") from None
        except OSError as exc:
            raise TraceError(f"{self.path}: cannot read it ({exc.strerror or exc})") from None
        self._offset += len(data)
        return self._consume(data)

    def _consume(self, data: bytes) -> int:
        buffer = self._pending + data
        lines = buffer.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_LINE_BYTES:
            # No writer produces such a line: damage. Drop it up to the next newline.
            self._pending = b""
            self._skipping_long_line = True
        applied = 0
        for line in lines:
            if self._skipping_long_line:
                self._skipping_long_line = False
                self.damaged_lines += 1
                continue
            if line.strip():
                applied += self._apply_line(line)
        return applied

    def _apply_line(self, line: bytes) -> int:
        if self.trace is None:
            try:
                header = parse_header_line(line, self.path)
            except TraceError as exc:
                self._fatal = exc  # later lines must not be mistaken for a header
                raise
            self.trace = Trace(header, self.path)
            return 1
        try:
            apply_record(self.trace, self._ids, json.loads(line))
        except RECORD_ERRORS:
            self.damaged_lines += 1
            return 0
        return 1

    def _load_compressed(self) -> int:
        # Writers compress a trace only on a clean close, so it is complete: read it whole.
        if self.trace is not None:
            return 0
        self.trace = load_trace(self.path)
        self._offset = self.path.stat().st_size
        return self.trace.values_read + self.trace.event_count() + 1

    def _restart(self) -> None:
        self.trace = None
        self._offset = 0
        self._pending = b""
        self._ids = {}
        self._skipping_long_line = False
        self._fatal = None
        self.restarts += 1


def trace_until(trace: Trace, until_t: float) -> Trace:
    """The part of `trace` recorded up to `until_t`: what a replay has shown so far.

    Series are sliced, not copied value by value, so this stays cheap for large traces.
    """
    prefix = Trace(trace.header, trace.path)
    prefix.warnings = list(trace.warnings)
    for device in trace.devices_by_index.values():
        prefix.add_device(device)
    for process in trace.processes():
        if process.t <= until_t:
            prefix.add_process(process)
    for status in trace.collectors():
        if status.t <= until_t:
            prefix.add_collector(status)
    for key in trace.series_keys():
        series = trace.series(key.metric, key.device, key.pid)
        if series is None:
            continue
        times, values = series.window(float("-inf"), until_t)
        if len(times):
            # Same package as the reader: the prefix is built in place, without a value loop.
            prefix._series[key] = Series(key, array("d", times), array("d", values))
            prefix.values_read += len(times)
            prefix.last_t = max(prefix.last_t, times[-1])
    for event in trace.iter_events():
        if event.t <= until_t:
            prefix.add_event(event)
    if trace.exit is not None and trace.exit.t <= until_t:
        prefix.exit = trace.exit
    return prefix
