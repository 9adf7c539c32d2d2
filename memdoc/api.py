"""The in-code API: `memdoc.watch` (context manager and decorator), `memdoc.step`, `memdoc.mark`."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from memdoc import recordings
from memdoc.session import DEFAULT_INTERVAL_S, Session

P = ParamSpec("P")
R = TypeVar("R")

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


def step(**data: Any) -> None:
    """Mark a training-step boundary. Does nothing when no memdoc session is active."""
    session = active_session()
    if session is not None:
        session.step(source="user", **data)


def mark(label: str, *, snapshot: bool = False, **data: Any) -> None:
    """Mark a phase ("eval", "epoch 3"). Does nothing when no memdoc session is active.

    With `snapshot=True` and allocation recording on, a PyTorch allocation snapshot is saved.
    """
    session = active_session()
    if session is not None:
        session.mark(label, snapshot=snapshot, **data)


def default_trace_path(directory: str | os.PathLike[str] = ".") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(directory) / f"memdoc-{stamp}-{os.getpid()}.memdoc"


class watch:
    """Record memory while a block (or a decorated function) runs.

        with memdoc.watch("run.memdoc") as w:
            for batch in loader:
                train_step(batch)
                w.step()

    An exception leaving the block is recorded (an OOM with its parsed fields) and
    re-raised unchanged. At the end, a short diagnosis is printed to stderr when something
    went wrong, one quiet line otherwise (`quiet=True` silences it).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        force: bool = False,
        quiet: bool = False,
    ) -> None:
        self.path = Path(path) if path is not None else default_trace_path()
        self.interval = interval
        self.force = force
        self.quiet = quiet
        self.session: Session | None = None
        self._writer: Any = None
        self._entry: Path | None = None

    # -- context manager ------------------------------------------------------------------

    def __enter__(self) -> watch:
        from memdoc.collectors.registry import in_process_collectors
        from memdoc.forecast.live import ForecastingSink
        from memdoc.session import header_for_this_process
        from memdoc.trace.model import ProcessInfo
        from memdoc.trace.writer import TraceWriter

        header = header_for_this_process(sys.argv, interval_s=self.interval, mode="watch")
        self._writer = TraceWriter(self.path, header, force=self.force)
        self._writer.process(
            ProcessInfo(pid=os.getpid(), t=time.time(), ppid=os.getppid(), command=tuple(sys.argv))
        )
        self.session = Session(
            ForecastingSink(self._writer, start_unix=self._writer.start_unix),
            in_process_collectors(host_tree=True, trace_dir=self.path.resolve().parent),
            interval_s=self.interval,
        )
        self.session.start()
        push_session(self.session)
        self._entry = recordings.register(self.path, sys.argv)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from memdoc.trace.model import ExitInfo

        session = self.session
        if session is None:
            return
        pop_session(session)
        recordings.unregister(self._entry)
        self._entry = None
        if exc is not None:
            session.record_exception(exc, tb, where="watch")
        session.stop()
        code = 0 if exc is None else 1
        self._writer.close(ExitInfo(t=time.time(), exit_code=code, reason="watch block ended"))
        if not self.quiet:
            _print_summary(self.path)

    # -- decorator ------------------------------------------------------------------------

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with watch(self.path, interval=self.interval, force=True, quiet=self.quiet):
                return func(*args, **kwargs)

        return wrapper

    # -- inside the block -----------------------------------------------------------------

    def step(self, **data: Any) -> None:
        if self.session is not None:
            self.session.step(source="user", **data)

    def mark(self, label: str, **data: Any) -> None:
        if self.session is not None:
            self.session.mark(label, **data)


def _print_summary(path: Path) -> None:
    try:
        from memdoc.report.summary import print_end_of_run

        print_end_of_run([path], stream=sys.stderr)
    except Exception as exc:
        print(f"memdoc: trace written to {path} (no summary: {exc})", file=sys.stderr)
