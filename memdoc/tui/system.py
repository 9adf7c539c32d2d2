"""`memdoc top`'s source: every GPU process on this machine, and host memory, sampled live."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import psutil

from memdoc.collectors.base import CollectorFailed, Values
from memdoc.collectors.host import HostCollector
from memdoc.collectors.nvml import NvmlCollector
from memdoc.collectors.nvml_gate import NvmlGate, open_gate
from memdoc.errors import MemdocError
from memdoc.recordings import Recording, live_recordings
from memdoc.trace import (
    SCHEMA_VERSION,
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    Header,
    Metric,
    ProcessInfo,
    SeriesKey,
    Trace,
)
from memdoc.trace.tail import TraceTail
from memdoc.tui.sources import KIND_SYSTEM, SourceState
from memdoc.tui.under_memdoc import LiveRecording

DEFAULT_INTERVAL_S = 1.0
# Host RSS of the processes on the GPUs: psutil reads cost tens of µs each, so not every tick.
PROCESS_RSS_INTERVAL_S = 3.0
# Programs that run under memdoc announce themselves; a new one shows up within this time.
RECORDINGS_INTERVAL_S = 2.0
# Reading a long trace from its start takes a while: at most this much of each sample.
TAIL_BUDGET_S = 0.2
TAIL_CHUNK_BYTES = 1024 * 1024


class TraceSink:
    """A collector's session handle that records into an in-memory trace (absolute times in,
    trace-relative times stored), so that the system view is drawn like any trace."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._t0 = trace.header.created_unix
        self._step = 0

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        self.trace.add_values(unix_t - self._t0, ((k, float(v)) for k, v in values.items()))

    def event(self, event: Event) -> None:
        self.trace.add_event(Event(event.t - self._t0, event.kind, event.pid, event.data))

    def device(self, device: DeviceInfo) -> None:
        self.trace.add_device(device)

    def process(self, process: ProcessInfo) -> None:
        rel = ProcessInfo(
            process.pid,
            process.t - self._t0,
            process.ppid,
            process.command,
            process.ours,
            process.user,
        )
        self.trace.add_process(rel)

    def collector(self, status: CollectorStatus) -> None:
        self.trace.add_collector(status)

    def step(self, source: str = "user", **data: Any) -> int:
        self._step += 1
        self.emit(EventKind.STEP, {"step": self._step, "source": source, **data})
        return self._step

    def record_exception(
        self,
        exc: BaseException,
        tb: TracebackType | None = None,
        *,
        where: str = "uncaught",
        context: Mapping[str, Any] | None = None,
    ) -> None:
        del exc, tb, where, context  # a system view has no program of its own to report on

    def note_raised(self, exc: BaseException, outer: list[str] | None = None) -> None:
        del exc, outer

    def emit(self, kind: str, data: Mapping[str, Any] | None = None) -> None:
        self.event(Event(time.time(), kind, os.getpid(), dict(data or {})))


class RecordingTails:
    """The traces of the recordings running on this machine, each read as it grows."""

    def __init__(
        self,
        find: Callable[[], Sequence[Recording]],
        *,
        budget_s: float = TAIL_BUDGET_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._find = find
        self._budget_s = budget_s
        self._monotonic = monotonic
        self._tails: dict[Recording, TraceTail] = {}
        self._current: set[Recording] = set()  # read up to the end once: its values are recent
        self._broken: set[Recording] = set()

    def refresh(self) -> None:
        """Read the registry: follow new recordings, forget those that ended."""
        try:
            found = list(self._find())
        except OSError:
            return
        for recording in found:
            if recording not in self._tails:
                self._tails[recording] = TraceTail(
                    recording.trace_path, chunk_bytes=TAIL_CHUNK_BYTES
                )
        for gone in set(self._tails) - set(found):
            del self._tails[gone]
            self._current.discard(gone)
            self._broken.discard(gone)

    def poll(self) -> tuple[LiveRecording, ...]:
        """Read what each trace gained; a trace is shown once it was read to its end."""
        deadline = self._monotonic() + self._budget_s
        for recording, tail in self._tails.items():
            if recording in self._broken:
                continue
            try:
                tail.poll()
                while not tail.caught_up and self._monotonic() < deadline:
                    tail.poll()
            except MemdocError:
                self._broken.add(recording)  # not a trace (any more): listed, not read
                continue
            if tail.caught_up:
                self._current.add(recording)
        return tuple(
            LiveRecording(r, t.trace if r in self._current and r not in self._broken else None)
            for r, t in self._tails.items()
        )

    @property
    def pids(self) -> set[int]:
        """Every process the recordings own."""
        return {
            p.pid
            for tail in self._tails.values()
            if tail.trace
            for p in tail.trace.processes(ours=True)
        }


class SystemSource:
    """Samples NVML (every device and process) and host memory every `interval_s`.

    Without an NVIDIA driver it shows host memory, and says so once.
    """

    kind = KIND_SYSTEM

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        gate_factory: Callable[[], NvmlGate] = open_gate,
        clock: Callable[[], float] = time.time,
        find_recordings: Callable[[], Sequence[Recording]] = live_recordings,
    ) -> None:
        self.label = "this machine"
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._paused = False
        self._last_sample = float("-inf")
        self._last_rss = float("-inf")
        self._last_registry = float("-inf")
        self._tails = RecordingTails(find_recordings)
        self._recordings: tuple[LiveRecording, ...] = ()
        created = clock()
        header = Header(
            version=SCHEMA_VERSION,
            created_unix=created,
            memdoc_version="",  # never written: an in-memory trace
            host=os.uname().nodename,
            pid=os.getpid(),
            interval_s=interval_s,
            mode="system",
        )
        self.trace = Trace(header)
        self._sink = TraceSink(self.trace)
        # The host collector rooted at memdoc itself gives the system-wide values and the
        # cgroup; memdoc's own RSS is left out below.
        self._host: HostCollector | None = HostCollector(os.getpid(), include_children=False)
        self._nvml: NvmlCollector | None = NvmlCollector(os.getpid(), gate_factory=gate_factory)
        self._notes: list[str] = []
        self._started = False

    def poll(self) -> SourceState:
        with self._lock:
            now = self._clock()
            if not self._started:
                self._start()
            if not self._paused and now - self._last_sample >= self.interval_s * 0.95:
                self._last_sample = now
                self._sample(now)
            return SourceState(
                kind=self.kind,
                label=self.label,
                trace=self.trace,
                now_t=self.trace.last_t,
                paused=self._paused,
                live=True,
                notes=tuple(self._notes),
                recordings=self._recordings,
            )

    def set_paused(self, paused: bool) -> None:
        with self._lock:
            self._paused = paused

    def close(self) -> None:
        with self._lock:
            for collector in (self._nvml, self._host):
                if collector is not None:
                    collector.close()
            self._nvml = self._host = None

    def _start(self) -> None:
        self._started = True
        for name in ("_host", "_nvml"):
            collector: HostCollector | NvmlCollector | None = getattr(self, name)
            if collector is None:
                continue
            status = collector.probe()
            self._sink.collector(status)
            if status.available:
                collector.start(self._sink)
            else:
                self._notes.append(status.reason or f"{status.name} is not available here")
                setattr(self, name, None)

    def _sample(self, now: float) -> None:
        values: Values = {}
        for name in ("_host", "_nvml"):
            collector: HostCollector | NvmlCollector | None = getattr(self, name)
            if collector is None:
                continue
            try:
                values.update(collector.sample(now))
            except CollectorFailed as exc:
                self._notes.append(exc.reason)
                collector.close()
                setattr(self, name, None)
        if now - self._last_registry >= RECORDINGS_INTERVAL_S:
            self._last_registry = now
            self._tails.refresh()
        self._recordings = self._tails.poll()
        values = {k: v for k, v in values.items() if k.metric != Metric.HOST_RSS}
        if now - self._last_rss >= PROCESS_RSS_INTERVAL_S:
            self._last_rss = now
            self._rss_of_gpu_processes(values)
        self._sink.samples(now, values)

    def _rss_of_gpu_processes(self, values: Values) -> None:
        pids = {k.pid for k in self.trace.series_keys() if k.metric == Metric.GPU_PROC_USED}
        pids |= {k.pid for k in values if k.metric == Metric.GPU_PROC_USED}
        pids |= self._tails.pids
        for pid in pids:
            if pid is None:
                continue
            try:
                values[SeriesKey(Metric.HOST_RSS, pid=pid)] = psutil.Process(pid).memory_info().rss
            except psutil.Error:
                continue
