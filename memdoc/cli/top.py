"""`memdoc top`: every GPU process on this machine with its memory, and host memory, live."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from memdoc.cli.common import seconds
from memdoc.cli.live import require_terminal
from memdoc.cli.serve import exporting
from memdoc.errors import MemdocError

if TYPE_CHECKING:
    from memdoc.tui.sources import SampleSource, SourceState
    from memdoc.tui.system import SystemSource

NAME = "top"
HELP = "show every GPU process on this machine and the memory ledger, live (like nvitop)"

MIN_INTERVAL_S = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=seconds,
        default=1.0,
        metavar="S",
        help="seconds between samples (default 1)",
    )
    parser.add_argument(
        "--serve",
        type=int,
        metavar="PORT",
        help="also serve Prometheus metrics on this port; without a terminal, only serve",
    )
    parser.add_argument(
        "--serve-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics are served on (default 127.0.0.1)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.interval >= MIN_INTERVAL_S:
        raise MemdocError(f"--interval must be at least {MIN_INTERVAL_S:g} s")
    from memdoc.tui.system import SystemSource

    if args.serve is None:
        require_terminal()
        return _dashboard(SystemSource(args.interval))
    return _serve(SystemSource(args.interval), args)


def _dashboard(source: SampleSource) -> int:
    from memdoc.tui.app import make_app

    app = make_app(source)
    app.run()
    return app.return_code or 0


class _ServedSource:
    """The system source, polled under a lock that the exporter takes too: a scrape never
    reads the trace while a sample is being added to it."""

    def __init__(self, source: SystemSource) -> None:
        self.source = source
        self.lock = threading.Lock()
        self.kind = source.kind
        self.label = source.label

    def poll(self) -> SourceState:
        with self.lock:
            return self.source.poll()

    def set_paused(self, paused: bool) -> None:
        self.source.set_paused(paused)

    def close(self) -> None:
        with self.lock:
            self.source.close()


def _serve(source: SystemSource, args: argparse.Namespace) -> int:
    from memdoc.metrics.families import MemdocCollector
    from memdoc.metrics.identity import job_identity
    from memdoc.metrics.sources import SharedTraceSource

    served = _ServedSource(source)
    served.poll()  # the first sample, so that the first scrape has values
    state = SharedTraceSource(lambda: source.trace, served.lock)
    collector = MemdocCollector(state, job_identity(os.environ))
    # Said before the dashboard takes the screen: it stays in the terminal's scrollback.
    with exporting(collector, args.serve, args.serve_address, quiet=False):
        if sys.stdin.isatty() and sys.stdout.isatty():
            return _dashboard(served)
        return _sample_until_stopped(served, args.interval)


def _sample_until_stopped(served: _ServedSource, interval_s: float) -> int:
    """Headless: sample every interval until SIGTERM or Ctrl-C (a node's exporter daemon)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop.wait(interval_s):
            served.poll()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        served.close()
    return 0
