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
    live = _LiveRun(options)
    # The terminal's Ctrl-C belongs to the program (in the same process group); memdoc
    # waits for the program to end, as a shell would.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, _ignore)}
    for signum in _FORWARDED:
        previous[signum] = signal.signal(signum, live.forward)
    for signum in _OUTLIVED:
        previous[signum] = signal.signal(signum, live.outlive)
    try:
        live.worker.start()
        deadline = time.monotonic() + TRACE_WAIT_S
        while (
            not options.output.exists() and live.worker.is_alive() and time.monotonic() < deadline
        ):
            time.sleep(POLL_S / 2)
        if not live.terminated and not live.hung_up:  # a SIGTERM before the dashboard: none
            live.dashboard_up = True
            _show_dashboard(options.output, log_path, live.interrupt)
            live.dashboard_up = False
        _pass_output_through(log_path, live)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if live.error is not None:
        raise live.error
    assert live.result is not None
    return live.result


class _LiveRun:
    """The program running on its own thread, and what the signal handlers have seen of it.

    The handlers run on the main thread (the dashboard's), between its steps; they only set
    flags here, signal the program and schedule the dashboard's exit.
    """

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.pids: list[int] = []
        options.started = self.pids.append
        self.worker = threading.Thread(target=self._run, name="memdoc-run", daemon=True)
        self.result: RunResult | None = None
        self.error: BaseException | None = None
        self.terminated = False  # memdoc got SIGTERM: the program is ending
        self.hung_up = False  # the terminal went away: nothing more to draw or print on
        self.dashboard_up = False

    def _run(self) -> None:
        try:
            self.result = run_program(self.options)
        except BaseException as exc:
            self.error = exc

    def _program_running(self) -> bool:
        return bool(self.pids) and self.worker.is_alive()

    def interrupt(self) -> None:
        """Ctrl-C on the dashboard: interrupt the program as a terminal would."""
        if self._program_running():
            interrupt_like_a_terminal(self.pids[0])

    def forward(self, signum: int, frame: FrameType | None) -> None:
        if self._program_running():
            _signal_child(self.pids[0], signum)
        if signum == signal.SIGTERM:
            self.terminated = True
            _close_dashboard()  # the program is ending: its output and the summary follow

    def outlive(self, signum: int, frame: FrameType | None) -> None:
        passed_on = _from_kill(signum, dashboard_up=self.dashboard_up)
        if self._program_running() and passed_on:
            _signal_child(self.pids[0], signum)
        if signum == signal.SIGHUP and not passed_on:
            self.hung_up = True
        if passed_on or self.hung_up:
            _close_dashboard()  # the program is ending, or no terminal is left to draw on


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


def _pass_output_through(log_path: Path, live: _LiveRun) -> None:
    """Copy the program's output, from its start, to stdout while the program runs on; once
    the terminal hangs up (or stdout fails), just wait: the output stays in the log."""
    worker = live.worker
    out = sys.stdout.buffer
    try:
        log = open(log_path, "rb")  # noqa: SIM115 - read until the program ends
    except OSError:
        worker.join()
        return
    with log:
        while not live.hung_up:
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
