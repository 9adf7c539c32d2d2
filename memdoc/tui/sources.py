"""Where the dashboard's data comes from: a trace being written, a finished trace, the system."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from memdoc.errors import MemdocError
from memdoc.trace import Header, Trace
from memdoc.trace.tail import TraceTail
from memdoc.tui.under_memdoc import LiveRecording

# Replay speeds offered by the faster/slower keys.
SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)

KIND_FOLLOW = "follow"
KIND_REPLAY = "replay"
KIND_SYSTEM = "system"
# A trace not closed, with nothing new for this long and whose writer is gone, has ended:
# a writer flushes at least every 0.5 s while it lives.
ABANDONED_AFTER_S = 10.0
# A process created this long after the trace is another one that got the writer's pid.
_PID_REUSE_SLACK_S = 1.0


@dataclass(frozen=True)
class SourceState:
    """What a source holds after one poll. `now_t` is the instant to show, in trace seconds."""

    kind: str
    label: str
    trace: Trace | None
    now_t: float
    paused: bool = False
    live: bool = False  # more data may still arrive
    ended: bool = False  # not closed, but its writer is gone: nothing more will arrive
    behind: bool = False  # the source has more to read right now: poll again soon
    speed: float | None = None
    end_t: float | None = None
    notes: tuple[str, ...] = ()
    error: str | None = None
    damaged_lines: int = 0
    # Recordings running on this machine; None from a source that does not look for them.
    recordings: tuple[LiveRecording, ...] | None = None


class SampleSource(Protocol):
    """A data source for the dashboard. `poll` runs on a worker thread; the rest on the UI."""

    kind: str
    label: str

    def poll(self) -> SourceState:
        """Read what is new. Never raises for bad data: it says so in the state."""

    def set_paused(self, paused: bool) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Seekable(Protocol):
    """A source whose clock the user drives: replay speed and seeking."""

    def set_speed(self, speed: float) -> None: ...

    def change_speed(self, steps: int) -> float: ...

    def seek_by(self, delta_s: float) -> None: ...

    def seek_to(self, t_s: float) -> None: ...


class TraceFollowSource:
    """Follows a trace file while it is written, from this or another node."""

    kind = KIND_FOLLOW

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.label = self.path.name
        self._tail = TraceTail(self.path)
        self._lock = threading.Lock()
        self._paused = False
        self._paused_at: float | None = None
        self._error: str | None = None

    def poll(self) -> SourceState:
        with self._lock:
            if self._error is None:
                try:
                    self._tail.poll()
                except MemdocError as exc:
                    self._error = exc.message
            return self._state()

    def _state(self) -> SourceState:
        trace = self._tail.trace
        if trace is None:
            note = () if self._error else (f"waiting for {self.path} to be written",)
            return SourceState(
                self.kind, self.label, None, 0.0, live=True, notes=note, error=self._error
            )
        latest = trace.duration_s
        if self._paused and self._paused_at is None:
            self._paused_at = latest
        ended = not trace.complete and abandoned(trace, time.time())
        live = not trace.complete and self._error is None and not ended
        return SourceState(
            kind=self.kind,
            label=self.label,
            trace=trace,
            now_t=self._paused_at if self._paused_at is not None else latest,
            paused=self._paused_at is not None,
            live=live,
            ended=ended,
            behind=not self._tail.caught_up,
            error=self._error,
            damaged_lines=self._tail.damaged_lines,
        )

    def set_paused(self, paused: bool) -> None:
        # The file is still read while paused, so that resuming jumps to the present.
        with self._lock:
            self._paused = paused
            trace = self._tail.trace
            self._paused_at = trace.duration_s if paused and trace is not None else None

    def close(self) -> None:
        pass


def abandoned(trace: Trace, now_unix: float) -> bool:
    """True when nothing was added for ABANDONED_AFTER_S and the process that wrote the
    trace, on this machine, is gone. A writer on another machine cannot be checked: its
    trace stays live (the dashboard says how long it has been silent)."""
    silent_s = now_unix - (trace.header.created_unix + trace.last_t)
    return silent_s > ABANDONED_AFTER_S and _writer_gone(trace.header)


def _writer_gone(header: Header) -> bool:
    if header.pid is None or (header.host and header.host != socket.gethostname()):
        return False
    import psutil

    try:
        started = float(psutil.Process(header.pid).create_time())
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False  # cannot tell: better live than wrongly ended
    return started > header.created_unix + _PID_REUSE_SLACK_S


class ReplaySource:
    """Plays a finished trace back in trace time, with pause, speed and seek."""

    kind = KIND_REPLAY

    def __init__(
        self,
        trace: Trace,
        *,
        speed: float = 1.0,
        start_s: float = 0.0,
        paused: bool = False,
        clock: Callable[[], float] = time.monotonic,
        label: str | None = None,
    ) -> None:
        self.trace = trace
        self.label = label or (trace.path.name if trace.path else "trace")
        self.end_t = trace.duration_s
        self._clock = clock
        self._lock = threading.Lock()
        self._speed = _nearest_speed(speed)
        self._paused = paused
        self._anchor_t = self._clamp(start_s)
        self._anchor_clock = clock()

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def paused(self) -> bool:
        return self._paused

    def cursor(self) -> float:
        """The trace time being shown now."""
        with self._lock:
            return self._cursor()

    def poll(self) -> SourceState:
        with self._lock:
            now_t = self._cursor()
            return SourceState(
                kind=self.kind,
                label=self.label,
                trace=self.trace,
                now_t=now_t,
                paused=self._paused or now_t >= self.end_t,
                speed=self._speed,
                end_t=self.end_t,
                notes=tuple(self.trace.warnings),
            )

    def set_paused(self, paused: bool) -> None:
        with self._lock:
            self._reanchor()
            if not paused and self._anchor_t >= self.end_t:
                self._anchor_t = 0.0  # playing at the end starts over
            self._paused = paused

    def set_speed(self, speed: float) -> None:
        with self._lock:
            self._reanchor()
            self._speed = _nearest_speed(speed)

    def change_speed(self, steps: int) -> float:
        """Move `steps` along SPEEDS (negative: slower); return the new speed."""
        with self._lock:
            self._reanchor()
            i = SPEEDS.index(self._speed) + steps
            self._speed = SPEEDS[min(len(SPEEDS) - 1, max(0, i))]
            return self._speed

    def seek_by(self, delta_s: float) -> None:
        with self._lock:
            self._reanchor()
            self._anchor_t = self._clamp(self._anchor_t + delta_s)

    def seek_to(self, t_s: float) -> None:
        with self._lock:
            self._reanchor()
            self._anchor_t = self._clamp(t_s)

    def close(self) -> None:
        pass

    def _cursor(self) -> float:
        if self._paused:
            return self._anchor_t
        elapsed_s = self._clock() - self._anchor_clock
        return self._clamp(self._anchor_t + elapsed_s * self._speed)

    def _reanchor(self) -> None:
        self._anchor_t = self._cursor()
        self._anchor_clock = self._clock()

    def _clamp(self, t_s: float) -> float:
        return min(self.end_t, max(0.0, t_s))


def _nearest_speed(speed: float) -> float:
    return min(SPEEDS, key=lambda s: abs(s - speed))
