"""Run a command in a process group of its own, and end the whole group when it must stop:
on a timeout, and when the process waiting for it is interrupted or terminated."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import IO

# How long one probe of `memdoc headroom` may run before it is ended.
PROBE_TIMEOUT_S = 1800.0
# Between SIGTERM and SIGKILL: time for `memdoc run` to close its trace.
GRACE_S = 5.0
# Signals that end this process as a scheduler or a closed terminal would.
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """This process was sent SIGTERM or SIGHUP while it waited (a BaseException, as
    KeyboardInterrupt is: no `except Exception` may swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def ending_signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Terminated` in the main thread (so that
    `finally` blocks run and end what was started); outside it, they act as before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, _frame: FrameType | None) -> None:
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, raise_terminated) for sig in _ENDING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_in_own_group(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    stdout: IO[bytes],
    timeout_s: float,
    grace_s: float = GRACE_S,
) -> int:
    """Run `command` to its end in a new session (its own process group) and return its
    exit status. On a timeout, an interrupt or any other exception, every process of the
    group is sent SIGTERM, then SIGKILL after `grace_s`, before the exception goes on.

    Raises:
        subprocess.TimeoutExpired: still running after `timeout_s` (and now ended).
    """
    child = subprocess.Popen(
        list(command),
        env=dict(env),
        stdout=stdout,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return child.wait(timeout=timeout_s)
    except BaseException:
        end_group(child, grace_s)
        raise


def end_group(child: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
    """SIGTERM to `child`'s process group, SIGKILL to what is left of it after `grace_s`.

    The group's id is the child's pid (it leads its own session): the number stays taken
    while any process of the group lives, so the signals never reach another group. A second
    signal to this process waits until the group is ended."""
    with _signals_held():
        _end_group(child, grace_s)


def _end_group(child: subprocess.Popen[bytes], grace_s: float) -> None:
    _signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # Whatever ignored SIGTERM, or outlived the child, goes now.
        _signal_group(child.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace_s)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *_ENDING_SIGNALS})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
