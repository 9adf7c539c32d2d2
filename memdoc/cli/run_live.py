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

    for signum in _FORWARDED:
        previous[signum] = signal.signal(signum, forward)
    try:
        worker = threading.Thread(target=target, name="memdoc-run", daemon=True)
        worker.start()
        deadline = time.monotonic() + TRACE_WAIT_S
        while not options.output.exists() and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)

        def interrupt() -> None:
            if pids and worker.is_alive():
                interrupt_like_a_terminal(pids[0])

        if not terminated:  # a SIGTERM before the dashboard is up: no dashboard at all
            _show_dashboard(options.output, log_path, interrupt)
        _pass_output_through(log_path, worker)
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


def _pass_output_through(log_path: Path, worker: threading.Thread) -> None:
    """Copy the program's output, from its start, to stdout while the program runs on."""
    out = sys.stdout.buffer
    try:
        log = open(log_path, "rb")  # noqa: SIM115 - read until the program ends
    except OSError:
        worker.join()
        return
    with log:
        while True:
            running = worker.is_alive()
            while chunk := log.read(CHUNK_BYTES):
                out.write(chunk)
            out.flush()
            if not running:
                return
            worker.join(POLL_S)
