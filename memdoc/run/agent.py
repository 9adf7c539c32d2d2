"""The agent inside each Python process of `memdoc run`: framework collectors and OOM capture."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from memdoc.caught import watch_caught_errors
from memdoc.collectors.base import SessionHandle, Values
from memdoc.collectors.devices import ACCELERATOR_SIGNS, present
from memdoc.collectors.launcher import first_int, launcher_ranks
from memdoc.collectors.loops.handlers import FORWARD_ERRORS_ENV, watch_forward_passes
from memdoc.collectors.registry import agent_collectors
from memdoc.run.channel import ENV_INTERVAL, ENV_SOCKET, AgentChannel
from memdoc.run.handled import exit_recording_error_in_hand
from memdoc.run.settle import SettleRule
from memdoc.session import (
    DEFAULT_INTERVAL_S,
    Session,
    host_memory_now,
    pop_session,
    push_session,
)
from memdoc.trace.model import CollectorStatus, EventKind, ProcessInfo, SeriesKey

# Set by `memdoc headroom`: end the program cleanly after this many steps.
ENV_STOP_AFTER_STEPS = "MEMDOC_STOP_AFTER_STEPS"
# ... and, where set, only once this many steps in a row have not raised the peak (see
# settle.py), at most at MEMDOC_MAX_STEPS steps or MEMDOC_SETTLE_S seconds of stepping.
ENV_SETTLE_STEPS = "MEMDOC_SETTLE_STEPS"
ENV_MAX_STEPS = "MEMDOC_MAX_STEPS"
ENV_SETTLE_S = "MEMDOC_SETTLE_S"

_state: dict[str, Any] = {}


class StepLimitedSession(Session):
    """A session that ends the program with exit status 0 once it has counted
    `stop_after_steps` steps (only when asked to: a headroom probe needs a few steps, not a
    whole training run), or, with a `settle` rule, once the peak has stopped rising after
    them. The stop event carries the process's address-space high-water mark, which the
    sampler may miss between two samples."""

    stop_after_steps: int | None = None
    settle: SettleRule | None = None

    def tick(self) -> None:
        super().tick()
        if isinstance(self.sink, AgentChannel):
            self.sink.pump()  # what the program queued since the last send goes out now

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        super().samples(unix_t, values)
        if self.settle is not None:
            self._sampled_peaks = _usage_maxima(getattr(self, "_sampled_peaks", {}), values)

    def step(self, source: str = "user", **data: Any) -> int:
        number = super().step(source, **data)
        if self.stop_after_steps is None:
            return number
        if self.settle is None:
            if number >= self.stop_after_steps:
                self._end_probe(number, {})
            return number
        now_s = time.monotonic()
        host = _host_peaks()
        peaks = {k: float(v) for k, v in host.items() if k.endswith("_peak_bytes")}
        peaks.update(getattr(self, "_sampled_peaks", {}))
        self.settle.observe(number, now_s, peaks)
        if self.settle.done(number, now_s, evaluating=_evaluating()):
            rule = self.settle
            self._end_probe(
                number,
                {"settled": rule.settled, "why": rule.why, "last_rise_step": rule.last_rise_step},
                host,
            )
        return number

    def _end_probe(
        self, number: int, data: dict[str, Any], host: dict[str, int] | None = None
    ) -> None:
        payload = {"after_steps": number, "host": host or _host_peaks(), **data}
        self.emit(EventKind.STOP, payload)
        raise SystemExit(0)


def settle_rule(environ: Mapping[str, str], min_steps: int | None) -> SettleRule | None:
    """The settle rule `memdoc headroom` asked for in the environment; None when it asked
    for a fixed number of steps (or none)."""
    quiet = first_int(environ, (ENV_SETTLE_STEPS,))
    if min_steps is None or quiet is None:
        return None
    max_steps = first_int(environ, (ENV_MAX_STEPS,)) or max(min_steps, 1) * 4
    try:
        max_s = float(environ.get(ENV_SETTLE_S, "300"))
    except ValueError:
        max_s = 300.0
    return SettleRule(min_steps, quiet, max(max_steps, min_steps), max_s)


def _usage_maxima(
    known: dict[str, float], values: Mapping[SeriesKey, int | float]
) -> dict[str, float]:
    """`known` with the highest value yet of every series that runs into a limit (address
    space, a framework's pool, a GPU's memory), by series."""
    from memdoc.forecast.budget import budget_for, peak_source

    out = dict(known)
    for key, value in values.items():
        if budget_for(key) is None and peak_source(key) is None:
            continue
        name = f"{key.metric}:{key.device}:{key.pid}"
        out[name] = max(float(value), out.get(name, float("-inf")))
    return out


def _evaluating() -> bool:
    """A framework loop is in its evaluation or prediction phase now."""
    from memdoc.collectors.loops import hub

    return hub.current_phase() in (hub.EVAL, hub.PREDICT)


def _host_peaks() -> dict[str, int]:
    """This process's memory now plus its peaks so far (VmPeak, VmHWM), in bytes."""
    out = host_memory_now()
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmPeak", "VmHWM"):
                key = "address_space_peak_bytes" if name == "VmPeak" else "rss_peak_bytes"
                out[key] = int(rest.split()[0]) * 1024
    return out


def activate() -> None:
    """Connect to the parent and start sampling. Never raises: without a parent, nothing runs."""
    try:
        _start()
    except Exception:
        _state.clear()


def _start() -> None:
    socket_path = os.environ.get(ENV_SOCKET)
    if not socket_path:
        return
    channel = AgentChannel(socket_path)
    try:
        interval_s = float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL_S))
    except ValueError:
        interval_s = DEFAULT_INTERVAL_S
    session = StepLimitedSession(
        channel, [*agent_collectors(), LaunchRankWatcher()], interval_s=interval_s
    )
    session.stop_after_steps = first_int(os.environ, (ENV_STOP_AFTER_STEPS,))
    session.settle = settle_rule(os.environ, session.stop_after_steps)
    channel.process(
        ProcessInfo(
            pid=os.getpid(),
            t=time.time(),
            ppid=os.getppid(),
            command=tuple(sys.orig_argv),
            rank=_ranks()[0],
            local_rank=_ranks()[1],
        )
    )
    session.start(thread=sampler_thread_wanted())
    push_session(session)
    if not _state:  # hooks are installed once per interpreter, sessions replaced after fork
        _install_hooks()
    _state["session"] = session
    _state["channel"] = channel


# Set to "thread" or "steps" to choose how the agent samples, over the choice below.
ENV_SAMPLER = "MEMDOC_SAMPLER"


def sampler_thread_wanted(signs: tuple[str, ...] = ACCELERATOR_SIGNS) -> bool:
    """Whether the agent samples on a thread of its own, between the program's steps.

    Only a device's counters move unseen between steps: the parent samples host memory for
    the whole process tree. Where the machine has no accelerator, or the process runs under
    an address-space cap, the agent starts no thread and samples at the program's steps, at
    an out-of-memory error and at the end. In glibc a thread's first allocation reserves a
    malloc arena of 64 MiB of address space: a program under a cap would lose it, and one
    that sets its cap later (relative to what it has mapped) would find its own threads
    allocating from memdoc's reserve, with more room than it has alone."""
    chosen = os.environ.get(ENV_SAMPLER, "").strip().lower()
    if chosen in ("thread", "steps"):
        return chosen == "thread"
    if address_space_capped():
        return False
    return present(signs)


def address_space_capped() -> bool:
    """True when this process runs under an address-space cap (RLIMIT_AS). The agent then
    starts no thread: in glibc a thread's first allocation usually reserves a malloc arena
    of 64 MiB of address space, which the program would lose under its cap. It samples at
    the program's steps instead, and when the program ends."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return False
    return soft != resource.RLIM_INFINITY


class LaunchRankWatcher:
    """Reports this process's rank when it changes: launchers set RANK/LOCAL_RANK before the
    process starts, but `mp.spawn`-style code often sets them inside the worker function."""

    name = "launch-rank"

    def __init__(self) -> None:
        self._session: SessionHandle | None = None
        self._known: tuple[int | None, int | None] | None = None

    def probe(self) -> CollectorStatus:
        return CollectorStatus(self.name, True)

    def start(self, session: SessionHandle) -> None:
        self._session = session
        self._known = _ranks()  # the process record at start already carries these

    def sample(self, unix_t: float) -> Values:
        ranks = _ranks()
        if ranks != self._known and self._session is not None:
            self._known = ranks
            self._session.process(
                ProcessInfo(pid=os.getpid(), t=unix_t, rank=ranks[0], local_rank=ranks[1])
            )
        return {}

    def close(self) -> None:
        self._session = None


def _ranks() -> tuple[int | None, int | None]:
    rank, local_rank = launcher_ranks(os.environ)
    return (rank if rank is not None else _process_group_rank(), local_rank)


def _process_group_rank() -> int | None:
    """The rank `torch.distributed.init_process_group(rank=...)` was given, once the program
    has initialised it: `torch.multiprocessing.spawn` workers often set no variable."""
    dist: Any = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        return None
    return None


def _session() -> Session | None:
    session = _state.get("session")
    return session if isinstance(session, Session) else None


def _install_hooks() -> None:
    previous_excepthook = sys.excepthook
    previous_thread_hook = threading.excepthook

    def excepthook(
        exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        session = _session()
        # Ctrl-C is not a memory matter; recording it here would make Python exit with
        # status 1 instead of by SIGINT (130), which the caller's shell tells apart.
        if session is not None and not issubclass(exc_type, KeyboardInterrupt):
            with contextlib.suppress(Exception):
                session.record_exception(exc, tb, where="uncaught")
        previous_excepthook(exc_type, exc, tb)  # Python prints the traceback as always

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        session = _session()
        if session is not None and args.exc_value is not None:
            with contextlib.suppress(Exception):
                session.record_exception(args.exc_value, args.exc_traceback, where="thread")
        previous_thread_hook(args)

    sys.excepthook = excepthook
    threading.excepthook = thread_hook
    sys.exit = exit_recording_error_in_hand(sys.exit, _session_at_error)
    watch_caught_errors(_session_at_error)
    if os.environ.get(FORWARD_ERRORS_ENV) == "1" and sys.version_info < (3, 12):
        watch_forward_passes()
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork)


def _session_at_error() -> Session | None:
    """The session, its process's rank brought up to date: set since the last sample, maybe."""
    session = _session()
    if session is not None:
        with contextlib.suppress(Exception):
            _report_rank(session)
    return session


def _report_rank(session: Session) -> None:
    """Record the rank now, in case the program set it since the last sample."""
    rank, local_rank = _ranks()
    if rank is not None or local_rank is not None:
        session.process(
            ProcessInfo(pid=os.getpid(), t=time.time(), rank=rank, local_rank=local_rank)
        )


def _at_exit() -> None:
    session = _session()
    channel = _state.get("channel")
    if session is not None:
        try:
            session.emit(EventKind.PROCESS_EXIT, {"how": "python-exit"})
            session.stop()
        except Exception:
            pass
    if isinstance(channel, AgentChannel):
        channel.close()


def _after_fork() -> None:
    # Threads do not survive fork: a forked worker (DataLoader, multiprocessing "fork")
    # gets a session and a connection of its own.
    stale = _state.pop("session", None)
    _state.pop("channel", None)
    if isinstance(stale, Session):
        pop_session(stale)
    activate()
