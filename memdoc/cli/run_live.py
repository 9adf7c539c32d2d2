"""`memdoc run --live`: the dashboard while the program runs, then its output as it comes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import psutil

from memdoc.cli.common import warn
from memdoc.run.interrupt import interrupt_like_a_terminal
from memdoc.run.parent import RunOptions, RunResult, run_program

TRACE_WAIT_S = 5.0
POLL_S = 0.1
CHUNK_BYTES = 1 << 16
# Sent to memdoc by another process (a scheduler, `kill`), never by the terminal: passed on
# to the program, as `memdoc run` without the dashboard does. A terminal's signals (SIGINT,
# SIGQUIT, SIGHUP) reach the program itself, in the same foreground process group.
_FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# Signals that would end memdoc before the trace is closed: memdoc outlives them, passing each
# on only where the terminal cannot have sent it to the program already (see `_from_kill`).
_OUTLIVED = (signal.SIGHUP, signal.SIGQUIT)


def run_live(options: RunOptions) -> RunResult:
    """Run the program with the dashboard in front; when the dashboard closes (`q`, or
    Ctrl-C, which interrupts the program as a terminal would), the program's output so far
    and from then on goes to stdout, until the program ends."""
    log_path = options.output_log
    assert log_path is not None, "a live run writes the program's output to a log"
    pids: list[int] = []
    options.started = pids.append
    outcome: dict[str, RunResult | BaseException] = {}

    def target() -> None:
        try:
            outcome["result"] = run_program(options)
        except BaseException as exc:
            outcome["error"] = exc

    # The terminal's Ctrl-C belongs to the program (in the same process group); memdoc
    # waits for the program to end, as a shell would.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, _ignore)}
    terminated: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if pids and worker.is_alive():
            _signal_child(pids[0], signum)
        if signum == signal.SIGTERM:
            terminated.append(signum)
            _close_dashboard()  # the program is ending: its output and the summary follow

    dashboard_up: list[bool] = []

    def outlive(signum: int, frame: FrameType | None) -> None:
        passed_on = _from_kill(signum, dashboard_up=bool(dashboard_up))
        if pids and worker.is_alive() and passed_on:
            _signal_child(pids[0], signum)
        if signum == signal.SIGHUP and not passed_on:
            hung_up.append(signum)
        if passed_on or hung_up:
            _close_dashboard()  # the program is ending, or no terminal is left to draw on

    hung_up: list[int] = []
    for signum in _FORWARDED:
        previous[signum] = signal.signal(signum, forward)
    for signum in _OUTLIVED:
        previous[signum] = signal.signal(signum, outlive)
    try:
        worker = threading.Thread(target=target, name="memdoc-run", daemon=True)
        worker.start()
        deadline = time.monotonic() + TRACE_WAIT_S
        while not options.output.exists() and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)

        def interrupt() -> None:
            if pids and worker.is_alive():
                interrupt_like_a_terminal(pids[0])

        if not terminated and not hung_up:  # a SIGTERM before the dashboard: none at all
            dashboard_up.append(True)
            _show_dashboard(options.output, log_path, interrupt)
            dashboard_up.clear()
        _pass_output_through(log_path, worker, hung_up)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    error = outcome.get("error")
    if isinstance(error, BaseException):
        raise error
    result = outcome["result"]
    assert isinstance(result, RunResult)
    return result


def _ignore(signum: int, frame: FrameType | None) -> None:
    """SIGINT while memdoc waits: the program got it too and decides what happens."""


def _from_kill(signum: int, *, dashboard_up: bool) -> bool:
    """Whether a SIGHUP or SIGQUIT came from another process rather than the terminal, which
    sends it to the whole foreground process group, the program included. A terminal that
    hung up is no longer memdoc's controlling terminal; while the dashboard is up the
    terminal is in raw mode and Ctrl-\\ sends no SIGQUIT."""
    if signum == signal.SIGHUP:
        return _has_terminal()
    return dashboard_up


def _has_terminal() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def _signal_child(pid: int, signum: int) -> None:
    """Pass `signum` on to memdoc's program, unless its PID now names another process."""
    with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
        if psutil.Process(pid).ppid() == os.getpid():
            os.kill(pid, signum)


def _close_dashboard() -> None:
    """Close the dashboard from a signal handler: the handler runs on the dashboard's own
    thread, inside its event loop, so the exit is scheduled there rather than done at once."""
    from memdoc.tui.app import close_running_app

    with contextlib.suppress(RuntimeError):  # no dashboard running (not yet, or no more)
        asyncio.get_running_loop().call_soon_threadsafe(close_running_app)


def _show_dashboard(trace: Path, log_path: Path, interrupt: Callable[[], None]) -> None:
    try:
        from memdoc.tui.app import run_live_dashboard
    except ImportError as exc:
        warn(f"no dashboard ({exc}); the program runs on")
        return
    run_live_dashboard(trace, log_path=log_path, interrupt=interrupt)


def _pass_output_through(log_path: Path, worker: threading.Thread, hung_up: list[int]) -> None:
    """Copy the program's output, from its start, to stdout while the program runs on; once
    the terminal hangs up (or stdout fails), just wait: the output stays in the log."""
    out = sys.stdout.buffer
    try:
        log = open(log_path, "rb")  # noqa: SIM115 - read until the program ends
    except OSError:
        worker.join()
        return
    with log:
        while not hung_up:
            running = worker.is_alive()
            try:
                while chunk := log.read(CHUNK_BYTES):
                    out.write(chunk)
                out.flush()
            except OSError:
                break
            if not running:
                return
            worker.join(POLL_S)
    worker.join()
