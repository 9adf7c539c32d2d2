"""Read traces back: salvage damaged files, and answer questions with intention-named queries."""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import stat
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Any

from memdoc.errors import InputError, TraceError
from memdoc.files import require_regular_file
from memdoc.trace import codec
from memdoc.trace.eventlog import EventLog, EventView
from memdoc.trace.model import (
    FORMAT_NAME,
    FRAMEWORK_PREFIXES,
    SCHEMA_VERSION,
    STEP_HOST_READINGS,
    USER_STEP,
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    ExitInfo,
    Header,
    Loss,
    Metric,
    OomInfo,
    ProcessInfo,
    SeriesKey,
    framework_metric,
)
from memdoc.units import format_bytes

_GZIP_MAGIC = b"\x1f\x8b"
# A line this long is damage, not data: the writer never produces one.
MAX_LINE_BYTES = 16 * 1024 * 1024
# A trace compresses about ten times; a file that expands a hundred times more is a bomb
# (or damage), refused before it fills memory. Small files may expand to the floor.
MAX_EXPANSION = 100
MIN_DECOMPRESSED_LIMIT_BYTES = 16 * 1024 * 1024
# Days of sampling at ten lines a second; more is not a trace memdoc wrote.
MAX_LINES = 50_000_000
# What a damaged or hostile record raises as it is decoded (an Infinity where an id
# belongs overflows): the line is skipped, the rest is read.
RECORD_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    RecursionError,
)


@dataclass
class Series:
    """One series: times (seconds since start) and values, in time order."""

    key: SeriesKey
    times: array[float] = field(default_factory=lambda: array("d"))
    values: array[float] = field(default_factory=lambda: array("d"))

    def __len__(self) -> int:
        return len(self.values)

    def max(self) -> tuple[float, float] | None:
        """(t, value) of the highest value; None when empty."""
        if not self.values:
            return None
        best = max(range(len(self.values)), key=self.values.__getitem__)
        return self.times[best], self.values[best]

    def last(self) -> tuple[float, float] | None:
        if not self.values:
            return None
        return self.times[-1], self.values[-1]

    def at(self, t: float) -> float | None:
        """The last value recorded at or before `t`."""
        i = bisect.bisect_right(self.times, t)
        return self.values[i - 1] if i else None

    def window(self, t0: float, t1: float) -> tuple[Sequence[float], Sequence[float]]:
        """Times and values with t0 <= t <= t1."""
        i = bisect.bisect_left(self.times, t0)
        j = bisect.bisect_right(self.times, t1)
        return self.times[i:j], self.values[i:j]

    def max_between(self, t0: float, t1: float) -> float | None:
        _, values = self.window(t0, t1)
        return max(values) if values else None


@dataclass(frozen=True)
class StepStat:
    """Memory over one step: the value right after it and the highest value inside it."""

    step: int
    t_start: float
    t_end: float
    baseline: float | None
    peak: float | None
    # The baseline was read at the boundary itself (the step event's own reading of its
    # process's memory), not taken from the last sample before it.
    exact: bool = False


class Trace:
    """A loaded trace. Build it with `load_trace`, or `Trace.from_oom` for an error text alone."""

    def __init__(self, header: Header, path: Path | None = None) -> None:
        self.header = header
        self.path = path
        self.warnings: list[str] = []
        self.devices_by_index: dict[int, DeviceInfo] = {}
        self._series: dict[SeriesKey, Series] = {}
        self._events = EventLog()
        self._steps: tuple[int, EventView] | None = None  # (events then, steps()) when asked
        self._processes: dict[int, ProcessInfo] = {}
        self._collectors: list[CollectorStatus] = []
        self.exit: ExitInfo | None = None
        self.values_read = 0
        self.last_t = 0.0

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_oom(cls, oom: OomInfo) -> Trace:
        """A trace that holds only a parsed error text: what `memdoc explain` diagnoses."""
        header = Header(version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="", mode="text")
        trace = cls(header)
        trace.add_event(Event(t=0.0, kind=EventKind.OOM, data={"oom": oom.to_dict()}))
        return trace

    def copy(self) -> Trace:
        """A copy that later additions to this trace do not change (values copied; events,
        processes and devices are immutable records, shared)."""
        twin = Trace(self.header, self.path)
        twin.warnings = list(self.warnings)
        twin.devices_by_index = dict(self.devices_by_index)
        twin._series = {
            key: Series(key, array("d", s.times), array("d", s.values))
            for key, s in self._series.items()
        }
        twin._events = self._events.copy()
        twin._processes = dict(self._processes)
        twin._collectors = list(self._collectors)
        twin.exit = self.exit
        twin.values_read = self.values_read
        twin.last_t = self.last_t
        return twin

    def add_event(self, event: Event) -> None:
        self._events.add(event)
        self.last_t = max(self.last_t, event.t)

    def _add_read_event(
        self, fields: tuple[float, str, int | None, dict[str, Any]], line: bytes | None
    ) -> None:
        """`add_event` for an event just read from `line`, without making the `Event`."""
        t, kind, pid, data = fields
        self._events.append(t, kind, pid, data, line=line)
        self.last_t = max(self.last_t, t)

    def add_values(self, t: float, pairs: Iterable[tuple[SeriesKey, float]]) -> None:
        for key, value in pairs:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = Series(key)
            series.times.append(t)
            series.values.append(value)
            self.values_read += 1
        self.last_t = max(self.last_t, t)

    def add_device(self, device: DeviceInfo) -> None:
        self.devices_by_index[device.index] = device

    def add_process(self, process: ProcessInfo) -> None:
        """Several records may describe one process (the parent sees it, its agent says
        more): what a later record leaves unknown, an earlier one may tell."""
        earlier = self._processes.get(process.pid)
        if earlier is not None:
            known = {
                f.name: getattr(process, f.name)
                for f in fields(ProcessInfo)
                if getattr(process, f.name) not in (None, ())
            }
            process = replace(earlier, **known)
        self._processes[process.pid] = process

    def add_collector(self, status: CollectorStatus) -> None:
        self._collectors.append(status)

    # -- what the run was -----------------------------------------------------------------

    @property
    def is_text_only(self) -> bool:
        """True when the trace came from an error text, with no recorded samples."""
        return self.header.mode == "text"

    @property
    def complete(self) -> bool:
        """True when the writer closed the trace (an end record is present)."""
        return self.exit is not None

    @property
    def duration_s(self) -> float:
        return self.exit.t if self.exit is not None else self.last_t

    @property
    def rank(self) -> int | None:
        return self.header.rank

    def devices(self) -> list[DeviceInfo]:
        """Devices the driver reported, plus any that only framework series name."""
        known = dict(self.devices_by_index)
        for key in self._series:
            if key.device is not None and key.device not in known:
                known[key.device] = DeviceInfo(index=key.device, name=f"device {key.device}")
        return [known[i] for i in sorted(known)]

    def device_total_bytes(self, device: int) -> int | None:
        info = self.devices_by_index.get(device)
        if info is not None and info.total_bytes:
            return info.total_bytes
        total = self.series(Metric.GPU_TOTAL, device=device)
        last = total.last() if total is not None else None
        return int(last[1]) if last is not None else None

    def processes(self, *, ours: bool | None = None) -> list[ProcessInfo]:
        procs = list(self._processes.values())
        if ours is not None:
            procs = [p for p in procs if p.ours == ours]
        return sorted(procs, key=lambda p: p.t)

    def our_pids(self) -> set[int]:
        return {p.pid for p in self._processes.values() if p.ours}

    def collectors(self) -> list[CollectorStatus]:
        return list(self._collectors)

    def unavailable_collectors(self) -> list[CollectorStatus]:
        """Collectors that said they cannot work here (the last word per name and pid)."""
        last: dict[tuple[str, int | None], CollectorStatus] = {}
        for status in self._collectors:
            last[(status.name, status.pid)] = status
        return [s for s in last.values() if not s.available]

    def frameworks(self) -> list[str]:
        """Frameworks the program imported, in order of appearance."""
        seen: list[str] = []
        for event in self.events(EventKind.FRAMEWORK):
            name = str(event.data.get("name", ""))
            if name and name not in seen:
                seen.append(name)
        for key in self._series:
            for framework, prefix in FRAMEWORK_PREFIXES.items():
                if key.metric.startswith(prefix + ".") and framework not in seen:
                    seen.append(framework)
        return seen

    # -- series ---------------------------------------------------------------------------

    def series_keys(self) -> list[SeriesKey]:
        return list(self._series)

    def series(
        self, metric: str, device: int | None = None, pid: int | None = None
    ) -> Series | None:
        return self._series.get(SeriesKey(metric, device, pid))

    def series_for(self, metric: str, *, device: int | None = None) -> list[Series]:
        """Every series of a metric on a device, whatever the pid (one per process)."""
        return [s for k, s in self._series.items() if k.metric == metric and k.device == device]

    def framework_series(self, quantity: str, device: int | None) -> dict[str, Series]:
        """{framework: series} for a quantity such as Metric.ALLOCATED, summed over pids."""
        out: dict[str, Series] = {}
        for framework in FRAMEWORK_PREFIXES:
            found = self.series_for(framework_metric(framework, quantity), device=device)
            if found:
                out[framework] = found[0] if len(found) == 1 else sum_series(found)
        return out

    def peak(
        self, metric: str, device: int | None = None, pid: int | None = None
    ) -> tuple[float, float] | None:
        """(t, bytes) of the highest value, counting interval peaks recorded beside the value."""
        candidates = []
        for name in (metric, peak_metric(metric)):
            series = self.series(name, device, pid)
            if series is not None and (best := series.max()) is not None:
                candidates.append(best)
        return max(candidates, key=lambda tv: tv[1]) if candidates else None

    def per_step(
        self, metric: str, device: int | None = None, pid: int | None = None
    ) -> list[StepStat]:
        """Baseline (value after the step) and in-step peak, for each step event. A step
        starts at the step before it, or at a loop's phase mark since (an evaluation that
        ran between two training steps, training resumed): what the phase held is not the
        step's."""
        series = self.series(metric, device, pid)
        peaks = self.series(peak_metric(metric), device, pid)
        steps = self.steps()
        exact = self._step_readings(steps, metric, device, pid)
        stepping = steps[0].pid if len(steps) else None
        phase_marks = sorted(
            m.t for m in self.marks() if m.is_phase_mark and m.pid in (stepping, None)
        )
        out: list[StepStat] = []
        t_prev = 0.0
        for i, (t, number) in enumerate(zip(steps.times(), steps.values("step"), strict=True)):
            since = bisect.bisect_left(phase_marks, t) - 1
            if since >= 0 and phase_marks[since] > t_prev:
                t_prev = phase_marks[since]
            reading = exact[i] if exact else None
            baseline = reading
            peak_values: list[float] = []
            if series is not None:
                if baseline is None:
                    baseline = series.at(t + 1e-9)
                if (m := series.max_between(t_prev, t)) is not None:
                    peak_values.append(m)
            if peaks is not None and (m := peaks.max_between(t_prev, t)) is not None:
                peak_values.append(m)
            if reading is not None:
                peak_values.append(reading)
            out.append(
                StepStat(
                    step=int(number) if isinstance(number, int) else len(out) + 1,
                    t_start=t_prev,
                    t_end=t,
                    baseline=baseline,
                    peak=max(peak_values) if peak_values else None,
                    exact=reading is not None,
                )
            )
            t_prev = t
        return out

    def _step_readings(
        self, steps: EventView, metric: str, device: int | None, pid: int | None
    ) -> list[float | None]:
        """Each step's baseline of a host metric read at the boundary itself, where the step
        events carry their process's own reading; empty where they do not (older traces).

        For that process's own series the reading is the baseline. For the process tree's,
        it is the tree at its last sample with the stepping process's part of it brought
        up to the boundary: the other processes (data loader workers) as last sampled, or
        as first sampled for a step before the first sample."""
        key = STEP_HOST_READINGS.get(metric)
        if key is None or device is not None or not len(steps):
            return []
        readings = steps.values(key)
        if all(r is None for r in readings):
            return []
        stepping = steps[0].pid
        if pid is not None and pid != stepping:
            return []
        if pid is not None:
            return [float(r) if isinstance(r, int | float) else None for r in readings]
        tree, own = self.series(metric), self.series(metric, None, stepping)
        if tree is None or own is None or not own.times:
            return []
        out: list[float | None] = []
        for t, reading in zip(steps.times(), readings, strict=True):
            # The others at the last sample, or at the first for a step before any sample.
            when = max(t + 1e-9, own.times[0])
            at_tree, at_own = tree.at(when), own.at(when)
            if not isinstance(reading, int | float) or at_tree is None or at_own is None:
                out.append(None)
            else:
                out.append(at_tree - at_own + float(reading))
        return out

    # -- events ---------------------------------------------------------------------------

    def events(self, kind: str | None = None) -> list[Event]:
        """The events, or those of one kind, in the order recorded. Steps come in millions:
        read them through `steps()`, `iter_events()` or `event_count()` instead."""
        return list(self._events.view(kind))

    def iter_events(self, start: int = 0) -> Iterator[Event]:
        """The events in the order recorded, from the `start`-th on, made one at a time."""
        return iter(self._events.view()[start:])

    def event_count(self) -> int:
        return len(self._events)

    def stepping_pids(self) -> set[int]:
        """Every process that reported steps (`steps()` counts the first one's)."""
        return {pid for pid in self._events.view(EventKind.STEP).pids() if pid is not None}

    def steps(self) -> EventView:
        """Step boundaries. When several processes report steps, the first reporter's count;
        when that process marked steps itself, only those (not the optimizer's as well).

        A view: its `times()` and `values(key)` read the steps without making each event.
        """
        if self._steps is not None and self._steps[0] == len(self._events):
            return self._steps[1]
        steps = self._events.view(EventKind.STEP)
        if len(steps.pids()) > 1:
            steps = steps.with_pid(steps[0].pid)
        sources = steps.values("source")
        if USER_STEP in sources:
            steps = steps.where(source == USER_STEP for source in sources)
        self._steps = (len(self._events), steps)
        return steps

    def losses(self) -> list[Loss]:
        """Where agents dropped samples or events because memdoc could not keep up."""
        out = []
        for event in self.events(EventKind.LOSS):
            try:
                end_s = float(event.t)
                out.append(
                    Loss(
                        pid=event.pid,
                        start_s=end_s - float(event.data.get("duration_s", 0.0)),
                        end_s=end_s,
                        samples=int(event.data.get("samples", 0)),
                        events=int(event.data.get("events", 0)),
                    )
                )
            except (TypeError, ValueError):
                continue  # a damaged record says nothing reliable
        return out

    def marks(self) -> list[Event]:
        return self.events(EventKind.MARK)

    def oom_events(self) -> list[Event]:
        """OOM events; one that a parent only relayed (a spawn rank's error re-raised by
        `join`) is left out when the failing process recorded its own."""
        events = self.events(EventKind.OOM)
        own = {e.pid for e in events if "relayed_by" not in e.data}
        return [e for e in events if "relayed_by" not in e.data or e.pid not in own]

    def ooms(self) -> list[OomInfo]:
        return [oom for e in self.oom_events() if (oom := oom_of(e)) is not None]

    def ending_oom_event(self) -> Event | None:
        """The OOM event that ended the run (the last, when the run failed), else the first
        recorded, else None. Events whose OOM data cannot be read are passed over."""
        events = [e for e in self.oom_events() if oom_of(e) is not None]
        if not events:
            return None
        failed = self.exit is not None and self.exit.status not in (0, None)
        return events[-1] if failed else events[0]

    def ending_oom(self) -> OomInfo | None:
        """The OOM that ended the run, else the first one recorded, else None."""
        event = self.ending_oom_event()
        return oom_of(event) if event is not None else None


def peak_metric(metric: str) -> str:
    """The series that holds `metric`'s interval peaks ("torch.allocated_peak")."""
    if metric.endswith("." + Metric.ALLOCATED):
        return metric[: -len(Metric.ALLOCATED)] + Metric.ALLOCATED_PEAK
    if metric.endswith("." + Metric.RESERVED):
        return metric[: -len(Metric.RESERVED)] + Metric.RESERVED_PEAK
    return metric + "_peak"


def sum_series(parts: Sequence[Series]) -> Series:
    """Sum series sampled at different instants (each holds its last value)."""
    times = sorted({t for s in parts for t in s.times})
    total = Series(SeriesKey(parts[0].key.metric, parts[0].key.device, None))
    for t in times:
        values = [v for s in parts if (v := s.at(t)) is not None]
        total.times.append(t)
        total.values.append(sum(values))
    return total


def oom_of(event: Event) -> OomInfo | None:
    data = event.data.get("oom")
    if not isinstance(data, dict):
        return None
    try:
        return OomInfo.from_dict(data)
    except (TypeError, ValueError):
        return None


# -- loading ------------------------------------------------------------------------------


class _Decompressed:
    """A gzip trace read line by line, refused once it expands past `limit_bytes`."""

    def __init__(self, path: Path, stream: gzip.GzipFile, limit_bytes: int) -> None:
        self._path = path
        self._stream = stream
        self._limit_bytes = limit_bytes
        self._read_bytes = 0

    def readline(self, size: int = -1) -> bytes:
        line = self._stream.readline(size)
        self._read_bytes += len(line)
        if self._read_bytes > self._limit_bytes:
            raise TraceError(
                f"{self._path}: refused: it decompresses to more than "
                f"{format_bytes(self._limit_bytes)}, over {MAX_EXPANSION} times its size "
                "(a gzip bomb, or damage)"
            )
        return line

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> _Decompressed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: Path) -> IO[bytes] | _Decompressed:
    try:
        require_regular_file(path)  # a FIFO would block the open itself
    except InputError as exc:
        raise TraceError(exc.message) from None
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a folder, not a trace") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if raw.read(2) == _GZIP_MAGIC:
        size = os.fstat(raw.fileno()).st_size
        raw.close()
        limit = max(MIN_DECOMPRESSED_LIMIT_BYTES, MAX_EXPANSION * size)
        return _Decompressed(path, gzip.GzipFile(path, "rb"), limit)
    raw.seek(0)
    return raw


def _lines(stream: IO[bytes] | _Decompressed) -> Iterator[bytes]:
    try:
        while True:
            line = stream.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            yield line
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        # A truncated or damaged gzip stream: what was decoded so far is the salvage.
        return


def looks_like_trace(path: str | os.PathLike[str]) -> bool:
    """True when the file starts with a memdoc trace header (cheap: reads one line). A pipe
    or a device is not one: reading it could block, or never end."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with _open(Path(path)) as stream:
            first = stream.readline(MAX_LINE_BYTES)
        record = json.loads(first)
    except (
        TraceError,
        OSError,
        ValueError,
        EOFError,
        gzip.BadGzipFile,
        zlib.error,
        RecursionError,
    ):
        return False
    return isinstance(record, dict) and record.get("format") == FORMAT_NAME


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load a trace, salvaging what precedes any damage.

    Raises:
        TraceError: the file is missing, empty, not a memdoc trace, or of a newer version.
    """
    path = Path(path)
    with _open(path) as stream:
        return _parse(path, _lines(stream))


def read_header(path: str | os.PathLike[str]) -> Header:
    """The header of a trace file, reading its first line only.

    Raises:
        TraceError: the file is missing, unreadable, empty, not a regular file, not a
            memdoc trace, or of a newer version.
    """
    path = Path(path)
    with _open(path) as stream:
        return _parse_header(path, next(_lines(stream), None))


def load_trace_lines(
    lines: Iterable[bytes], path: Path | None = None, *, max_lines: int = MAX_LINES
) -> Trace:
    """Load a trace from lines already in memory (tests, streams)."""
    return _parse(path or Path("<memory>"), iter(lines), max_lines)


def _parse_header(path: Path, first: bytes | None) -> Header:
    if not first:
        raise TraceError(f"{path}: empty file, not a memdoc trace")
    try:
        record = json.loads(first)
    except (ValueError, RecursionError):
        raise TraceError(f"{path}: not a memdoc trace (no trace header)") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME:
        raise TraceError(f"{path}: not a memdoc trace (no trace header)")
    version = record.get("version")
    if not isinstance(version, int):
        raise TraceError(f"{path}: damaged trace header (no version)")
    if version > SCHEMA_VERSION:
        raise TraceError(
            f"{path}: trace format version {version} is newer than this memdoc reads "
            f"({SCHEMA_VERSION})",
            hint="upgrade memdoc: pip install -U memdoc",
        )
    try:
        return codec.decode_header(record)
    except (TypeError, ValueError, KeyError):
        raise TraceError(f"{path}: damaged trace header") from None


def _parse(path: Path, lines: Iterator[bytes], max_lines: int = MAX_LINES) -> Trace:
    header = _parse_header(path, next(lines, None))
    trace = Trace(header, path)
    ids: dict[int, SeriesKey] = {}
    bad = 0
    line_no = 1
    last_bad = 0
    for raw in lines:
        line_no += 1
        if line_no > max_lines:
            raise TraceError(
                f"{path}: refused: more than {max_lines} lines, more than memdoc ever writes "
                "(damage, or a file made to fill memory)"
            )
        try:
            _apply(trace, ids, json.loads(raw), raw)
        except RECORD_ERRORS:
            bad += 1
            last_bad = line_no
    if bad:
        where = "its last line" if bad == 1 and last_bad == line_no else f"{bad} damaged lines"
        trace.warnings.append(
            f"{path}: skipped {where} (a write cut short, or damage); the rest was read"
        )
    return trace


def _apply(trace: Trace, ids: dict[int, SeriesKey], record: Any, line: bytes | None) -> None:
    if isinstance(record, list):
        t = float(record[0])
        if not codec.is_time(t):
            raise ValueError("the sample time is not a time")
        pairs = []
        for i in range(1, len(record) - 1, 2):
            value = record[i + 1]
            # NaN and infinities are damage: the writer never writes them.
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                pairs.append((ids[int(record[i])], float(value)))
        trace.add_values(t, pairs)
        return
    kind = record["type"]
    if kind == codec.T_SERIES:
        sid, key = codec.decode_series(record)
        ids[sid] = key
    elif kind == codec.T_EVENT:
        trace._add_read_event(codec.decode_event_fields(record), line)
    elif kind == codec.T_DEVICE:
        trace.add_device(codec.decode_device(record))
    elif kind == codec.T_PROCESS:
        trace.add_process(codec.decode_process(record))
    elif kind == codec.T_COLLECTOR:
        trace.add_collector(codec.decode_collector(record))
    elif kind == codec.T_END:
        trace.exit = codec.decode_end(record)
    # Unknown record types from a newer writer of the same version are skipped on purpose.


def parse_header_line(line: bytes, path: Path | None = None) -> Header:
    """The header of a trace from its first line (for readers that follow a growing file).

    Raises:
        TraceError: the line is not a memdoc trace header, or is of a newer version.
    """
    return _parse_header(path or Path("<memory>"), line)


def apply_record(trace: Trace, ids: dict[int, SeriesKey], record: Any) -> None:
    """Add one decoded record (a line's JSON value) to `trace`, as `load_trace` does.

    `ids` maps series ids to keys and must be kept from one call to the next.

    Raises:
        One of RECORD_ERRORS: a damaged record.
    """
    _apply(trace, ids, record, None)


class Run:
    """Several traces of one run (ranks, nodes) read as one."""

    def __init__(self, traces: Sequence[Trace]) -> None:
        if not traces:
            raise TraceError("no traces given")
        self.traces = list(traces)

    @property
    def primary(self) -> Trace:
        """The trace that failed first, else the first given."""
        failed = self.failed_first()
        return failed if failed is not None else self.traces[0]

    def failed_first(self) -> Trace | None:
        """The trace whose OOM or non-zero exit came first in wall-clock time."""
        best: tuple[float, Trace] | None = None
        for trace in self.traces:
            ends = [e.t for e in trace.oom_events()]
            if trace.exit is not None and trace.exit.status not in (0, None):
                ends.append(trace.exit.t)
            if not ends:
                continue
            when = trace.header.created_unix + min(ends)
            if best is None or when < best[0]:
                best = (when, trace)
        return best[1] if best else None

    @property
    def warnings(self) -> list[str]:
        return [w for t in self.traces for w in t.warnings]


def load_run(paths: Sequence[str | os.PathLike[str]]) -> Run:
    """Load several traces as one run."""
    return Run([load_trace(p) for p in paths])
