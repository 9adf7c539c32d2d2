"""The seams every collector plugs into: the `Collector` and `Sink` protocols."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterable, Mapping
from types import FrameType, TracebackType
from typing import Any, Protocol

from memdoc.kinds import could_be_memory_error
from memdoc.trace.model import CollectorStatus, DeviceInfo, Event, ProcessInfo, SeriesKey

Values = dict[SeriesKey, int | float]


class Sink(Protocol):
    """Where samples and events go: the trace writer, or the channel to the parent."""

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None: ...

    def event(self, event: Event) -> None:
        """Record an event; `event.t` is absolute (`time.time()`)."""

    def device(self, device: DeviceInfo) -> None: ...

    def process(self, process: ProcessInfo) -> None: ...

    def collector(self, status: CollectorStatus) -> None: ...


class SessionHandle(Sink, Protocol):
    """What a collector may call back into: the sink, plus step and exception recording.

    Framework collectors use it to report steps from framework hooks (the PyTorch optimizer
    step hook) and OOMs caught by allocator observers.
    """

    def step(self, source: str = "user", **data: Any) -> int: ...

    def record_exception(
        self,
        exc: BaseException,
        tb: TracebackType | None = None,
        *,
        where: str = "uncaught",
        context: Mapping[str, Any] | None = None,
    ) -> None: ...

    def note_raised(self, exc: BaseException, outer: list[str] | None = None) -> None: ...

    def emit(self, kind: str, data: Mapping[str, Any] | None = None) -> None: ...


class Collector(Protocol):
    """Reads one backend. `probe` is cheap and says whether `sample` can work here.

    `start` is called once after a successful probe, with the session handle for devices,
    processes, steps and events the collector discovers; `sample` returns the values of
    one tick and must not block for long (a slow part keeps its own slower cadence inside).
    `close` releases what `start` took. A collector never raises out of `sample`: it
    returns what it has.
    """

    name: str

    def probe(self) -> CollectorStatus: ...

    def start(self, session: SessionHandle) -> None: ...

    def sample(self, unix_t: float) -> Values: ...

    def close(self) -> None: ...


class CollectorFailed(Exception):
    """Raised by `sample` when the backend broke for good; the session drops the collector."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


def note_raised(sessions: Iterable[SessionHandle], exc: BaseException, depth: int = 1) -> None:
    """Tell `sessions` of `exc`, rising out of a framework call memdoc wraps, when it may be a
    memory error (the program may still catch it). `depth`: frames between this call and
    the wrapper's caller; the caller's frames complete the error's traceback so far."""
    if not could_be_memory_error(exc):
        return
    # The caller's frames, outermost first, without reading their source lines from disk.
    caller = traceback.walk_stack(sys._getframe(depth + 1))
    outer = frame_strings(reversed(traceback.StackSummary.extract(caller, lookup_lines=False)))
    for session in sessions:
        session.note_raised(exc, outer)


def running_frames() -> set[int]:
    """The ids of the frames running on this thread, this function's caller and outward.
    Reading a running function frame's `f_locals` leaves a snapshot of its locals on the
    frame: in an `except` block, the error among them, a cycle (error, traceback, frame,
    snapshot, error) that keeps every object the traceback's frames hold alive until the
    next garbage collection, past the handler that would have freed them. Finished frames
    keep their locals anyway, and are read freely."""
    running: set[int] = set()
    here: FrameType | None = sys._getframe(1)
    while here is not None:
        running.add(id(here))
        here = here.f_back
    return running


def frame_strings(frames: Iterable[traceback.FrameSummary]) -> list[str]:
    """A stack as a trace records it: "file:line:function" for each frame, in the order
    given."""
    return [f"{f.filename}:{f.lineno}:{f.name}" for f in frames]
