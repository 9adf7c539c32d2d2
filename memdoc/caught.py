"""Memory errors the program catches: seen where Python shows them, for a session that
records them (the agent's under `memdoc run`, a `memdoc.watch` block's)."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from collections.abc import Callable
from types import CodeType
from typing import Any

from memdoc.kinds import could_be_memory_error
from memdoc.session import Session, memory_error_event

# sys.monitoring tool ids no convention reserves (0 debugger, 1 coverage, 2 profiler, 5
# optimizer): memdoc takes the first free one, and gives way when both are taken.
_FREE_TOOL_IDS = (3, 4)


def watch_caught_errors(session: Callable[[], Session | None]) -> Callable[[], None] | None:
    """Record each memory error the program catches, in the process and at the moment it
    is caught (Python 3.12+, through `sys.monitoring`). Older Pythons have no cheap way to
    see every caught exception: there memdoc sees those still being handled when a garbage
    collection runs (an OOM handler often calls `gc.collect()` before it tries again), the
    loops' own batch-size finders report theirs, and the framework calls memdoc wraps note
    those that leave them (`Session.note_raised`). Returns what ends the watch; None where
    none could start (both free tool ids taken)."""
    monitoring: Any = getattr(sys, "monitoring", None)
    if monitoring is None:
        callback = noting_collections(session)
        gc.callbacks.append(callback)
        return lambda: _remove(gc.callbacks, callback)
    tool = next((i for i in _FREE_TOOL_IDS if monitoring.get_tool(i) is None), None)
    if tool is None:
        return None

    def handled(code: CodeType, offset: int, exc: BaseException) -> None:
        if isinstance(exc, Exception) and could_be_memory_error(exc):
            record_memory_error(session, exc, where="caught")

    monitoring.use_tool_id(tool, "memdoc")
    monitoring.register_callback(tool, monitoring.events.EXCEPTION_HANDLED, handled)
    monitoring.set_events(tool, monitoring.events.EXCEPTION_HANDLED)

    def end() -> None:
        with contextlib.suppress(Exception):
            monitoring.set_events(tool, 0)
            monitoring.register_callback(tool, monitoring.events.EXCEPTION_HANDLED, None)
            monitoring.free_tool_id(tool)

    return end


def _remove(callbacks: list[Any], callback: Any) -> None:
    with contextlib.suppress(ValueError):
        callbacks.remove(callback)


def noting_collections(
    session: Callable[[], Session | None],
) -> Callable[[str, dict[str, int]], None]:
    """The collection callback: a memory error in hand when a collection starts is noted
    (`Session.note_raised`), and written as caught at the program's next step or when the
    session stops, unless recorded otherwise by then. A collection comes whenever the
    program allocates, often before it has decided what to do with the error: a handler
    that logs it and exits is recorded at the exit (with the memory at that moment), and a
    batch-size finder's own recording, with the size it tried, is the one kept."""
    busy = threading.local()

    def collecting(phase: str, info: dict[str, int]) -> None:
        if phase != "start" or getattr(busy, "on", False):
            return
        exc = sys.exc_info()[1]
        if isinstance(exc, Exception) and could_be_memory_error(exc):
            busy.on = True  # recording allocates: a collection it starts is not looked at
            try:
                _seen_in_hand(session, exc)
            finally:
                busy.on = False

    return collecting


def _seen_in_hand(session: Callable[[], Session | None], exc: Exception) -> None:
    """A collection found `exc` in hand: noted, unless it is noted already (as it leaves a
    wrapped call, with the caller's frames, which its traceback does not hold yet)."""
    with contextlib.suppress(Exception):
        current = session()
        if current is not None and not current.noted(exc):
            current.note_raised(exc)


def record_memory_error(
    session: Callable[[], Session | None], exc: Exception, *, where: str
) -> None:
    """Record `exc` if it is a memory error; the session is asked for only then."""
    with contextlib.suppress(Exception):
        if memory_error_event(exc, pid=os.getpid(), with_host=False) is None:
            return
        current = session()
        if current is not None:
            current.record_exception(exc, exc.__traceback__, where=where)
