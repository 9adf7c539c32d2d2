"""The in-code API: `memdoc.watch` (context manager and decorator), `memdoc.step`, `memdoc.mark`."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from memdoc import recordings
from memdoc.printable import printable
from memdoc.session import (
    DEFAULT_INTERVAL_S,
    Session,
    active_session,
    pop_session,
    push_session,
)

P = ParamSpec("P")
R = TypeVar("R")


def step(**data: Any) -> None:
    """Mark a training-step boundary. Does nothing when no memdoc session is active.

    Never raises: data named like memdoc's own fields (`step`, `source`) is kept as
    `user_step`, `user_source`; a value that is not a number or a string is kept as text.
    """
    session = active_session()
    if session is not None:
        _never_raising("memdoc.step", lambda: session.step(source="user", **_user_data(data)))


def mark(label: str, *, snapshot: bool = False, **data: Any) -> None:
    """Mark a phase ("eval", "epoch 3"). Does nothing when no memdoc session is active.

    With `snapshot=True` and allocation recording on, a PyTorch allocation snapshot is saved.
    Never raises, whatever the label and the data.
    """
    session = active_session()
    if session is not None:
        _never_raising(
            "memdoc.mark",
            lambda: session.mark(_text(label), snapshot=snapshot, **_user_data(data)),
        )


# Fields memdoc writes itself in a step or mark: the program's data of that name is kept
# beside them, prefixed.
_OWN_FIELDS = frozenset({"step", "source", "label"})
_PLAIN = (str, int, float, bool, type(None))
MAX_DATA_TEXT = 200


def _user_data(data: dict[str, Any]) -> dict[str, Any]:
    return {
        (f"user_{key}" if key in _OWN_FIELDS else key): (
            value if isinstance(value, _PLAIN) else _text(value)
        )
        for key, value in data.items()
    }


def _text(value: object) -> str:
    """`value` as text, whatever its `__str__` does."""
    if isinstance(value, str):
        return value
    try:
        return str(value)[:MAX_DATA_TEXT]
    except Exception:
        return f"<{type(value).__name__}>"


def _never_raising(call: str, record: Callable[[], object]) -> None:
    """Run memdoc's side of a public call; a failure of memdoc's own is said once, on
    stderr, and never reaches the program."""
    try:
        record()
    except Exception as exc:
        _say_once(("failed", Path(call)), f"memdoc: warning: {call} failed ({_reason(exc)})")


def default_trace_path(directory: str | os.PathLike[str] = ".", *, tag: str = "") -> Path:
    """`memdoc[-TAG]-YYYYmmdd-HHMMSS-PID.memdoc` in `directory`, with `-N` added until the
    name is free: a fresh name never lands on another recording."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stem = f"memdoc-{tag}-" if tag else "memdoc-"
    base = Path(directory) / f"{stem}{stamp}-{os.getpid()}"
    path = base.with_suffix(".memdoc")
    number = 1
    while path.exists():
        path = Path(f"{base}-{number}.memdoc")
        number += 1
    return path


class watch:
    """Record memory while a block (or a decorated function) runs.

        with memdoc.watch("run.memdoc") as w:
            for batch in loader:
                train_step(batch)
                w.step()

    memdoc never stops the program: when the trace exists already, the recording goes to a
    fresh name beside it (`run-1.memdoc`, `run-2.memdoc`, ...; said once on stderr, and
    `w.path` is the name used), unless `force=True`, which overwrites it. A decorated
    function gets a fresh trace at each call the same way. When the trace cannot be written
    at all (a missing or read-only folder), memdoc warns once and the block runs unobserved.

    An exception leaving the block is recorded (an OOM with its parsed fields) as raised out
    of the watched block, and re-raised unchanged; whether it then ends the process is the
    program's business. At the end, a short diagnosis is printed to stderr when something
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
        self._asked = self.path
        self._writer: Any = None
        self._forecasts: Any = None  # the ForecastingSink, imported when a watch starts
        # The frameworks' own loops report steps and phases to this session; a framework
        # callback that reports its loop itself turns this off (memdoc.integrations).
        self._loops = True
        self._entry: Path | None = None
        self._unwatch_caught: Callable[[], None] | None = None

    # -- context manager ------------------------------------------------------------------

    def __enter__(self) -> watch:
        try:
            self._start()
        except Exception as exc:  # memdoc's failure never becomes the program's
            self._abandon()
            _say_once(
                ("unobserved", self._asked),
                f"memdoc: warning: cannot record to {self._asked}: {_reason(exc)}; "
                "the block runs unobserved",
            )
        return self

    def _start(self) -> None:
        from memdoc.caught import watch_caught_errors
        from memdoc.collectors.registry import in_process_collectors
        from memdoc.forecast.live import ForecastingSink
        from memdoc.session import header_for_this_process
        from memdoc.trace.model import ProcessInfo

        header = header_for_this_process(sys.argv, interval_s=self.interval, mode="watch")
        self._writer = _open_writer(self._asked, header, force=self.force)
        self.path = self._writer.path
        self._writer.process(
            ProcessInfo(pid=os.getpid(), t=time.time(), ppid=os.getppid(), command=tuple(sys.argv))
        )
        self._forecasts = ForecastingSink(self._writer, start_unix=self._writer.start_unix)
        self.session = Session(
            self._forecasts,
            in_process_collectors(
                host_tree=True, trace_dir=self.path.resolve().parent, loops=self._loops
            ),
            interval_s=self.interval,
        )
        self.session.start()
        push_session(self.session)
        self._entry = recordings.register(self.path, sys.argv)
        # The memory errors the block catches and survives (a retry at a smaller batch).
        self._unwatch_caught = watch_caught_errors(lambda: self.session)

    def _stop_watching_caught(self) -> None:
        unwatch, self._unwatch_caught = self._unwatch_caught, None
        if unwatch is not None:
            with contextlib.suppress(Exception):
                unwatch()

    def _abandon(self) -> None:
        self._stop_watching_caught()
        session, self.session = self.session, None
        if session is not None:
            pop_session(session)
            with contextlib.suppress(Exception):
                session.stop()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close(None)
        self._writer = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session = self.session
        if session is None:
            return
        try:
            self._finish(session, exc, tb)
        except Exception as error:
            _say_once(("finish", self.path), f"memdoc: warning: {self.path}: {_reason(error)}")

    def _finish(
        self, session: Session, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        from memdoc.trace.model import RAISED_OUT_OF_WATCH, ExitInfo

        self._stop_watching_caught()
        self.session = None
        pop_session(session)
        recordings.unregister(self._entry)
        self._entry = None
        if exc is not None:
            session.record_exception(exc, tb, where="watch")
        session.stop()
        if self._forecasts is not None:
            self._forecasts.settle(time.time())
        # An exception leaving the block may still be caught by the program: no exit code.
        end = (
            ExitInfo(t=time.time(), exit_code=0, reason=WATCH_ENDED)
            if exc is None
            else ExitInfo(t=time.time(), reason=RAISED_OUT_OF_WATCH)
        )
        self._writer.close(end)
        if self._writer.error:  # a full disk: the trace stopped, the block ran on
            print(printable(f"memdoc: warning: {self._writer.error}"), file=sys.stderr)
        if not self.quiet:
            _print_summary(self.path)

    # -- decorator ------------------------------------------------------------------------

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Watch each call of `func`: for a coroutine or generator function, while it runs
        (awaited or iterated), not only while the call makes the coroutine or generator."""
        if inspect.iscoroutinefunction(func):
            return self._watching_coroutine(func)  # type: ignore[return-value]
        if inspect.isasyncgenfunction(func):
            return self._watching_async_generator(func)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(func):
            return self._watching_generator(func)  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self._again():
                return func(*args, **kwargs)

        return wrapper

    def _again(self) -> watch:
        """A fresh watch of the same trace, for one call of a decorated function."""
        return watch(self._asked, interval=self.interval, force=self.force, quiet=self.quiet)

    def _watching_coroutine(
        self, func: Callable[P, Coroutine[Any, Any, Any]]
    ) -> Callable[P, Coroutine[Any, Any, Any]]:
        @functools.wraps(func)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            with self._again():
                return await func(*args, **kwargs)

        return wrapper

    def _watching_generator(
        self, func: Callable[P, Generator[Any, Any, Any]]
    ) -> Callable[P, Generator[Any, Any, Any]]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Generator[Any, Any, Any]:
            with self._again():
                return (yield from func(*args, **kwargs))

        return wrapper

    def _watching_async_generator(
        self, func: Callable[P, AsyncGenerator[Any, Any]]
    ) -> Callable[P, AsyncGenerator[Any, Any]]:
        @functools.wraps(func)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[Any, Any]:
            with self._again():
                inner = func(*args, **kwargs)
                # What `yield from` does for a generator, by hand: values sent and exceptions
                # thrown in reach the wrapped generator unchanged.
                try:
                    value = await inner.__anext__()
                except StopAsyncIteration:
                    return
                while True:
                    try:
                        sent = yield value
                    except GeneratorExit:
                        await inner.aclose()
                        raise
                    except BaseException as exc:  # thrown in by the caller: pass it on
                        try:
                            value = await inner.athrow(exc)
                        except StopAsyncIteration:
                            return
                    else:
                        try:
                            value = await inner.asend(sent)
                        except StopAsyncIteration:
                            return

        return wrapper

    # -- inside the block -----------------------------------------------------------------

    def step(self, **data: Any) -> None:
        """`memdoc.step()` for this watch's session; never raises."""
        session = self.session
        if session is not None:
            _never_raising("watch.step", lambda: session.step(source="user", **_user_data(data)))

    def mark(self, label: str, **data: Any) -> None:
        """`memdoc.mark()` for this watch's session; never raises."""
        session = self.session
        if session is not None:
            snapshot = data.pop("snapshot", False)
            _never_raising(
                "watch.mark",
                lambda: session.mark(_text(label), snapshot=snapshot, **_user_data(data)),
            )


WATCH_ENDED = "watch block ended"
MAX_FRESH_NAMES = 10_000
_said: set[tuple[str, Path]] = set()


def _open_writer(path: Path, header: Any, *, force: bool) -> Any:
    """A writer on `path`, or on the first free `stem-N` beside it unless `force`.

    Raises:
        MemdocError: the folder is missing or not writable.
    """
    from memdoc.errors import OutputExistsError
    from memdoc.trace.writer import TraceWriter

    if force:
        return TraceWriter(path, header, force=True)
    for number in range(MAX_FRESH_NAMES):
        candidate = path if number == 0 else path.with_name(f"{path.stem}-{number}{path.suffix}")
        try:
            writer = TraceWriter(candidate, header)  # opens with "x": no race with another run
        except OutputExistsError:
            continue
        if number:
            _say_once(
                ("renamed", path),
                f"memdoc: {path} exists; recording to {candidate} "
                "(memdoc.watch(..., force=True) overwrites)",
            )
        return writer
    raise OutputExistsError(str(path))


def _say_once(key: tuple[str, Path], line: str) -> None:
    """One line on stderr per kind of news and trace name, however many blocks run."""
    if key in _said:
        return
    _said.add(key)
    print(line, file=sys.stderr)


def _reason(exc: BaseException) -> str:
    from memdoc.errors import MemdocError

    return exc.message if isinstance(exc, MemdocError) else f"{type(exc).__name__}: {exc}"


def _print_summary(path: Path) -> None:
    try:
        from memdoc.report.summary import print_end_of_run

        print_end_of_run([path], stream=sys.stderr)
    except Exception as exc:
        print(f"memdoc: trace written to {path} (no summary: {exc})", file=sys.stderr)
