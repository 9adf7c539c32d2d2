"""A sampling session: runs collectors on a thread and records steps, marks and exceptions."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

from memdoc.collectors.base import Collector, CollectorFailed, Sink, Values, frame_strings
from memdoc.collectors.own import step_memory, trim_heap
from memdoc.kinds import OomKind
from memdoc.trace.model import (
    HANDLED_WHEN_RAISED,
    SCHEMA_VERSION,
    USER_STEP,
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    Header,
    ProcessInfo,
    SeriesKey,
    allowlisted_env,
)

DEFAULT_INTERVAL_S = 0.1
MAX_MESSAGE_CHARS = 20_000
MAX_STACK_FRAMES = 40


# The sessions of this process that `memdoc.step()` and `memdoc.mark()` report to, the
# innermost last: kept here, beside the session, so that `memdoc run`'s agent, which starts
# before the program, imports no more than it needs.
_active: list[Session] = []
_active_lock = threading.Lock()


def active_session() -> Session | None:
    """The innermost active session of this process, if any."""
    with _active_lock:
        return _active[-1] if _active else None


def push_session(session: Session) -> None:
    with _active_lock:
        _active.append(session)


def pop_session(session: Session) -> None:
    with _active_lock:
        if session in _active:
            _active.remove(session)


class Session:
    """Samples every collector each `interval_s` on a daemon thread and writes to `sink`.

    A collector that fails is dropped with a note; the session and the program go on.
    """

    def __init__(
        self,
        sink: Sink,
        collectors: Sequence[Collector] = (),
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self.sink = sink
        self.interval_s = interval_s
        self.pid = os.getpid()
        self._pending = list(collectors)
        self._active: list[Collector] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step = 0
        self._explicit_steps = False  # the program marks its own steps: they alone count
        self._last_tick_mono = float("-inf")
        self._step_callbacks: list[Any] = []
        # Return the C heap's freed pages before each step's reading, so that the memory a
        # step boundary records is what the program holds, not what its allocator kept
        # (the pytest plugin's growth budgets; 1.5 ms a step).
        self.trim_heap_at_steps = False
        # Memory errors already recorded, for exceptions that take no attribute (see
        # `_first_sighting`): their ids and text.
        self._recorded_ooms: list[tuple[int, str]] = []
        # Memory errors noted (`note_raised`) and not yet written, as caught at the next step
        # or stop: (the note's mark, its events, the error's attributes, which say whether
        # it was recorded since; never the error itself, whose traceback would keep the
        # program's frames and tensors alive).
        self._raised: list[tuple[object, list[Event], dict[str, Any]]] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, *, thread: bool = True) -> Session:
        """Start the collectors and, unless `thread` is False, the sampler thread. Without
        it, the session samples once now, then at the program's steps (at most every half
        interval) and when it stops."""
        for collector in self._pending:
            self.add_collector(collector)
        self._pending.clear()
        if thread:
            self._thread = own_thread(self._loop, "memdoc-sampler")
        else:
            self.tick()
        return self

    def stop(self) -> None:
        """Take a last sample and close the collectors. Safe to call twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(2.0, 3 * self.interval_s))
        self.tick()
        self._write_raised()
        with self._lock:
            for collector in self._active:
                with contextlib.suppress(Exception):
                    collector.close()
            self._active.clear()

    def add_collector(self, collector: Collector) -> bool:
        """Probe and start a collector; record why when it cannot work. True if it runs."""
        try:
            status = collector.probe()
        except Exception as exc:
            status = CollectorStatus(name=collector.name, available=False, reason=repr(exc))
        status = _stamped(status, self.pid)
        self.sink.collector(status)
        if not status.available:
            return False
        try:
            collector.start(self)
        except Exception as exc:
            self.sink.collector(_stamped(_failed(collector.name, repr(exc)), self.pid))
            return False
        with self._lock:
            self._active.append(collector)
        return True

    def active_collectors(self) -> list[str]:
        with self._lock:
            return [c.name for c in self._active]

    # -- sampling -------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        """Sample every active collector once, now."""
        now = time.time()
        self._last_tick_mono = time.monotonic()
        merged: Values = {}
        with self._lock:
            for collector in list(self._active):
                try:
                    merged.update(collector.sample(now))
                except CollectorFailed as exc:
                    self._drop(collector, exc.reason, exc.hint)
                except Exception as exc:
                    self._drop(collector, f"stopped after an error: {exc!r}", None)
            if merged:
                # A bad value must not kill the sampler.
                with contextlib.suppress(Exception):
                    self.samples(now, merged)

    def _drop(self, collector: Collector, reason: str, hint: str | None) -> None:
        self._active.remove(collector)
        status = CollectorStatus(
            name=collector.name, available=False, reason=reason, hint=hint, t=time.time()
        )
        self.sink.collector(_stamped(status, self.pid))
        with contextlib.suppress(Exception):
            collector.close()

    # -- the Sink protocol, so collectors can write through the session ---------------------

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        self.sink.samples(unix_t, values)

    def event(self, event: Event) -> None:
        self.sink.event(event)

    def device(self, device: DeviceInfo) -> None:
        self.sink.device(device)

    def process(self, process: ProcessInfo) -> None:
        self.sink.process(process)

    def collector(self, status: CollectorStatus) -> None:
        self.sink.collector(_stamped(status, self.pid))

    # -- events ---------------------------------------------------------------------------

    def emit(self, kind: str, data: Mapping[str, Any] | None = None) -> None:
        self.sink.event(Event(t=time.time(), kind=kind, pid=self.pid, data=dict(data or {})))

    def step(self, source: str = USER_STEP, **data: Any) -> int:
        """Record a step boundary, with a sample right after it (the step's baseline).

        Steps the program marks itself (`source="user"`) win: from the first one on, steps
        detected automatically (the optimizer hook) are ignored and the count restarts at 1,
        so a loop with both `memdoc.step()` and `optimizer.step()` counts each step once.
        """
        with self._lock:
            if source == USER_STEP and not self._explicit_steps:
                self._explicit_steps = True
                self._step = 0
            elif source != USER_STEP and self._explicit_steps:
                return self._step
            self._step += 1
            number = self._step
        if self._raised:
            self._write_raised()  # the program went on: what it raised, it caught
        # The process's own memory at the boundary itself, read in 3 µs: the step's baseline
        # on the host, exact however long the step and whenever the host was last sampled.
        if self.trim_heap_at_steps:
            trim_heap()
        self.emit(EventKind.STEP, {"step": number, "source": source, **data, **step_memory()})
        # Steps faster than the sampling interval cannot be told apart anyway; sampling
        # after each of them would make a 3 ms step pay for a sample every time.
        if time.monotonic() - self._last_tick_mono >= self.interval_s / 2:
            self.tick()
        return number

    def mark(self, label: str, **data: Any) -> None:
        self.emit(EventKind.MARK, {"label": str(label)[:200], **data})
        from memdoc.collectors.frameworks import notify_mark

        with self._lock:
            active = list(self._active)
        notify_mark(active, label, data)  # e.g. mark(..., snapshot=True) saves a snapshot

    def record_exception(
        self,
        exc: BaseException,
        tb: TracebackType | None = None,
        *,
        where: str = "uncaught",
        context: Mapping[str, Any] | None = None,
    ) -> None:
        """Record an exception; a memory error also becomes an OOM event with parsed fields,
        plus `context` (what a loop's batch-size finder knew: the size it tried).

        An error another process raised and this one only relays (the parent of
        `torch.multiprocessing.spawn` re-raising a rank's error) is recorded as that
        process's OOM, without this process's memory, which says nothing about it.
        """
        self._claim_raised(exc)
        for earlier in handled_before(exc):
            self._claim_raised(earlier)
            for event in self._earlier_events(earlier):
                self.sink.event(event)
        for event in self._exception_events(exc, tb, where=where, context=context):
            self.sink.event(event)

    def _earlier_events(self, exc: BaseException) -> list[Event]:
        """A memory error the program was still handling when it raised the one being
        recorded (a retry inside its `except` block): caught, and kept alive, with its
        traceback's frames and what they held. Its figures are its message's: the memory
        now is not the memory then."""
        oom = memory_error_event(exc, pid=self.pid, with_host=False, where="caught")
        if oom is None or not self._first_sighting(exc):
            return []
        data = {**oom.data, HANDLED_WHEN_RAISED: True}
        return [
            exception_event(exc, exc.__traceback__, pid=self.pid, where="caught"),
            replace(oom, data=data),
        ]

    def note_raised(self, exc: BaseException, outer: list[str] | None = None) -> None:
        """A memory error rising out of a framework call memdoc wraps (a backward pass, a
        jitted JAX call), where the program may still catch it: recorded as caught when the
        program takes its next step or the session stops, unless it was recorded otherwise
        by then (uncaught, at exit, or caught as Python 3.12 reports it). On older Pythons
        this is how a hand-written retry loop's caught errors are seen. `outer`: the frames
        of the call that raised it, outermost first, which its traceback does not yet hold.
        Never raises."""
        try:
            attrs = getattr(exc, "__dict__", None)
            key = (self.pid, id(self))
            if not isinstance(attrs, dict) or key in attrs.get(_NOTED, {}):
                return  # noted already (raised through two wrapped calls), or unmarkable
            if key in attrs.get(_RECORDED_BY, frozenset()):
                return
            # Marked first: reading the error allocates, and a garbage collection that
            # starts meanwhile sees it in hand and notes it too (`memdoc.caught`).
            mark = object()
            attrs[_NOTED] = {**attrs.get(_NOTED, {}), key: mark}
            events = self._exception_events(
                exc, exc.__traceback__, where="caught", context=None, sighting=False
            )
            if not any(e.kind == EventKind.OOM for e in events):
                return
            if key in attrs.get(_RECORDED_BY, frozenset()):
                return  # recorded meanwhile (a collection while it was read recorded it)
            if outer:  # the whole stack, kept to as many frames as any other
                events = [
                    replace(
                        e,
                        data={**e.data, "stack": [*outer, *e.data["stack"]][-MAX_STACK_FRAMES:]},
                    )
                    for e in events
                ]
            with self._lock:
                self._raised.append((mark, events, attrs))
        except Exception:
            pass

    def noted(self, exc: BaseException) -> bool:
        """`exc` is noted (`note_raised`), or being noted now, by this session."""
        noted = getattr(exc, "__dict__", {}).get(_NOTED)
        return isinstance(noted, dict) and (self.pid, id(self)) in noted

    def _claim_raised(self, exc: BaseException) -> None:
        """`exc` is being recorded now: its note, if any, is not written as well."""
        noted = getattr(exc, "__dict__", {}).get(_NOTED) or {}
        mark = noted.get((self.pid, id(self))) if isinstance(noted, dict) else None
        if mark is None or not self._raised:
            return
        with self._lock:
            self._raised = [note for note in self._raised if note[0] is not mark]

    def _write_raised(self) -> None:
        with self._lock:
            raised, self._raised = self._raised, []
        key = (self.pid, id(self))
        for _, events, attrs in raised:
            if key in attrs.get(_RECORDED_BY, frozenset()):
                continue  # noted while it was being recorded (a collection meanwhile)
            for event in events:
                self.sink.event(event)

    def _exception_events(
        self,
        exc: BaseException,
        tb: TracebackType | None,
        *,
        where: str,
        context: Mapping[str, Any] | None,
        sighting: bool = True,
    ) -> list[Event]:
        """The exception event, and for a memory error seen for the first time its OOM event
        with what the frameworks knew at that moment. `sighting` False: the error is not
        marked as seen (a note, which a later recording of it replaces)."""
        events = [exception_event(exc, tb, pid=self.pid, where=where)]
        relayed_pid = relayed_from(exc)
        oom = memory_error_event(
            exc, pid=relayed_pid or self.pid, with_host=relayed_pid is None, where=where
        )
        if oom is None or (sighting and not self._first_sighting(exc)):
            return events
        if relayed_pid is not None:
            # This process's stack is where it re-raised, not where the rank failed.
            data = {**oom.data, "stack": [], "relayed_by": self.pid}
            return [*events, replace(oom, data=data)]
        from memdoc.collectors.frameworks import oom_context

        if self._thread is None:
            # Sampled at steps only: a sample now, so that a framework whose runtime started
            # since the last one is known (its live arrays and allocator state at the error
            # are then read), and the trace holds the memory at the error.
            with contextlib.suppress(Exception):
                self.tick()
        with self._lock:
            active = list(self._active)
        # What the frameworks knew at that moment (allocator stats, live arrays); the
        # session's own fields win.
        known = oom_context(active, exc)
        return [*events, replace(oom, data={**known, **dict(context or {}), **oom.data})]

    def _first_sighting(self, exc: BaseException) -> bool:
        """True the first time this session sees this very exception (caught by the program,
        then seen again at exit, is one event). Exceptions take no weak references, and ids
        are reused: a retry loop's next error often sits where the last one was, with the
        same text. So the exception itself carries which sessions recorded it."""
        mark = (self.pid, id(self))
        attrs = getattr(exc, "__dict__", None)
        if isinstance(attrs, dict):
            seen = attrs.get(_RECORDED_BY)
            if isinstance(seen, frozenset) and mark in seen:
                return False
            attrs[_RECORDED_BY] = (seen if isinstance(seen, frozenset) else frozenset()) | {mark}
            return True
        key = (id(exc), str(exc)[:200])
        with self._lock:
            if key in self._recorded_ooms:
                return False
            self._recorded_ooms = [*self._recorded_ooms[-7:], key]
        return True


# memdoc's threads run short Python loops: a small stack instead of glibc's default 8 MiB
# keeps them out of the address space a capped program counts.
OWN_THREAD_STACK_BYTES = 512 * 1024


def own_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread of memdoc's with a small stack; threads the program starts,
    before or after, keep the stack size they had."""
    previous = threading.stack_size(OWN_THREAD_STACK_BYTES)
    try:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
    finally:
        threading.stack_size(previous)
    return thread


# The most earlier errors followed back through an exception's context.
MAX_HANDLED_BEFORE = 32


def handled_before(exc: BaseException) -> list[BaseException]:
    """The errors `exc` was raised while handling (its `__context__` chain), oldest first;
    not those it was raised from or in place of (`raise ... from`), which are the same
    failure told again (TensorFlow turns its status error into ResourceExhaustedError)."""
    chain: list[BaseException] = []
    seen = {id(exc)}
    current = exc
    while len(chain) < MAX_HANDLED_BEFORE:
        earlier = current.__context__
        if earlier is None or id(earlier) in seen:
            break
        seen.add(id(earlier))
        if not current.__suppress_context__ and current.__cause__ is None:
            chain.append(earlier)
        current = earlier
    return chain[::-1]


# The attribute a recorded exception carries: (pid, session id) of each session that has it.
_RECORDED_BY = "_memdoc_recorded_by"
# The mark of a memory error noted as it rose out of a wrapped framework call (`note_raised`).
_NOTED = "_memdoc_noted"


def relayed_from(exc: BaseException) -> int | None:
    """The pid of the process that really raised `exc`, when this one only relays it:
    `torch.multiprocessing.spawn`'s ProcessException (a rank raised, or died) carries the
    rank's pid (`error_pid`; `pid` in older releases)."""
    if not any(cls.__name__ == "ProcessException" for cls in type(exc).__mro__):
        return None
    pid = getattr(exc, "error_pid", getattr(exc, "pid", None))
    return pid if isinstance(pid, int) and pid != os.getpid() else None


def header_for_this_process(command: Sequence[str], *, interval_s: float, mode: str) -> Header:
    """The trace header for a recording made from this process (`run` or `watch`)."""
    from memdoc.collectors.launcher import launcher_ranks, launcher_world_size
    from memdoc.version import __version__

    return Header(
        version=SCHEMA_VERSION,
        created_unix=time.time(),
        memdoc_version=__version__,
        command=tuple(command),
        host=socket.gethostname(),
        pid=os.getpid(),
        cwd=os.getcwd(),
        python=sys.version.split()[0],
        interval_s=interval_s,
        env=allowlisted_env(os.environ),
        rank=launcher_ranks(os.environ)[0],
        world_size=launcher_world_size(os.environ),
        mode=mode,
        cgroup_version=_cgroup_version(),
    )


def _cgroup_version() -> int | None:
    from memdoc.collectors.host import find_cgroup

    cgroup = find_cgroup(os.getpid())
    return cgroup.version if cgroup is not None else None


def exception_event(exc: BaseException, tb: TracebackType | None, *, pid: int, where: str) -> Event:
    frames = traceback.extract_tb(tb if tb is not None else exc.__traceback__)
    stack = frame_strings(frames)[-MAX_STACK_FRAMES:]
    return Event(
        t=time.time(),
        kind=EventKind.EXCEPTION,
        pid=pid,
        data={
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc)[:MAX_MESSAGE_CHARS],
            "stack": stack,
            "where": where,
        },
    )


def memory_error_event(
    exc: BaseException, *, pid: int, with_host: bool = True, where: str = "uncaught"
) -> Event | None:
    """An OOM event when the exception is a memory error (by type or by its text); with
    this process's memory at this instant unless `with_host` is False."""
    from memdoc.oom import parse_text
    from memdoc.trace.model import OomInfo

    text = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    if type(exc) is MemoryError:  # Python's own: the host ran out, whatever the text says
        oom: OomInfo | None = OomInfo(
            framework="host", kind=OomKind.HOST_ALLOC, message=text[:2000]
        )
    else:
        oom = parse_text(text[:MAX_MESSAGE_CHARS])
    if oom is None:
        return None
    stack = frame_strings(traceback.extract_tb(exc.__traceback__))[-MAX_STACK_FRAMES:]
    data: dict[str, Any] = {"oom": oom.to_dict(), "stack": stack, "where": where}
    if where == "caught":
        data["handled"] = True  # the program caught it and went on
    host = host_memory_now() if with_host else {}
    if host:
        data["host"] = host
    return Event(t=time.time(), kind=EventKind.OOM, pid=pid, data=data)


def host_memory_now() -> dict[str, int]:
    """This process's memory at this instant, read in-process (no sampler may have run since
    the program set its own cap): resident bytes, address space in use, the address-space
    cap (RLIMIT_AS) when one is set, and the tightest limit of this process's own cgroup
    (a rank may run in a cgroup of its own)."""
    from memdoc.collectors.own import own_memory

    out = own_memory()
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            out["rlimit_as_bytes"] = int(soft)
    except (OSError, ValueError, ImportError):
        pass
    try:
        from memdoc.collectors.cgroup import find_cgroup

        cgroup = find_cgroup(os.getpid())
        limit = cgroup.tightest_limit() if cgroup is not None else None
        if limit is not None:
            out["cgroup_limit_bytes"] = limit.limit_bytes
    except Exception:  # at an OOM even reading a file may fail: the rest still counts
        pass
    return out


def _stamped(status: CollectorStatus, pid: int) -> CollectorStatus:
    return CollectorStatus(
        name=status.name,
        available=status.available,
        t=status.t or time.time(),
        pid=status.pid if status.pid is not None else pid,
        reason=status.reason,
        hint=status.hint,
        version=status.version,
    )


def _failed(name: str, reason: str) -> CollectorStatus:
    return CollectorStatus(name=name, available=False, reason=reason)
