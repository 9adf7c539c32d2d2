"""`memdoc live`: the dashboard over a trace: follow it while it is written, else replay it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from memdoc.cli.common import expand_folders
from memdoc.errors import MemdocError

if TYPE_CHECKING:
    from memdoc.trace import Trace
    from memdoc.tui.sources import SampleSource

NAME = "live"
HELP = "show a trace in the live dashboard: follow it while it is written, replay it when finished"

MIN_SPEED, MAX_SPEED = 0.5, 16.0
WAIT_POLL_S = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="a memdoc trace, the traces of several ranks or nodes (or their folder), "
        "or files memdoc can import",
    )
    parser.add_argument(
        "--replay", action="store_true", help="replay the trace even while it is still written"
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help=f"replay speed, {MIN_SPEED:g} to {MAX_SPEED:g} (default 1)",
    )


def run(args: argparse.Namespace) -> int:
    if not MIN_SPEED <= args.speed <= MAX_SPEED:
        raise MemdocError(f"--speed must be between {MIN_SPEED:g} and {MAX_SPEED:g}")
    paths = [Path(p) for p in expand_folders(args.traces)]
    if _is_terminal():
        wait_for_traces(paths)  # a run about to start: follow it from its first record
    source = open_source(paths, replay=args.replay, speed=args.speed)
    require_terminal()
    from memdoc.tui.app import make_app

    app = make_app(source)
    app.run()
    return app.return_code or 0


def _is_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def wait_for_traces(paths: list[Path], *, poll_s: float = WAIT_POLL_S) -> None:
    """Wait, saying so once, until every trace exists and has its header; Ctrl-C stops.

    Raises:
        MemdocError: a trace's folder does not exist, so nothing can appear there.
    """
    from memdoc.trace.reader import looks_like_trace

    missing = [p for p in paths if not p.exists()]
    for path in missing:
        if not (path.parent if str(path.parent) else Path(".")).is_dir():
            raise MemdocError(f"{path}: no such file")
    if not missing:
        return
    names = ", ".join(str(p) for p in missing)
    print(f"memdoc: waiting for {names} to appear (ctrl+c to stop)", file=sys.stderr)
    while not all(looks_like_trace(p) for p in missing):
        time.sleep(poll_s)


def require_terminal() -> None:
    if not _is_terminal():
        raise MemdocError(
            "the dashboard needs a terminal",
            hint="for a file or a pipe, use memdoc diagnose TRACE or memdoc report TRACE",
        )


def open_source(paths: list[Path], *, replay: bool, speed: float) -> SampleSource:
    """Follow a trace still being written; replay a finished one, several ranks, or imports.

    Raises:
        MemdocError: a file is missing, or is neither a trace nor anything memdoc imports.
    """
    from memdoc.trace import load_run, load_trace
    from memdoc.trace.reader import looks_like_trace
    from memdoc.tui.sources import ReplaySource, TraceFollowSource

    for path in paths:
        if not path.exists():
            raise MemdocError(f"{path}: no such file")
    if all(looks_like_trace(p) for p in paths):
        if len(paths) > 1:
            # Several ranks: the one that failed first is the one worth watching.
            return ReplaySource(load_run(paths).primary, speed=speed)
        trace = load_trace(paths[0])
        if trace.complete or replay:
            return ReplaySource(trace, speed=speed)
        return TraceFollowSource(paths[0])
    return ReplaySource(_imported(paths), speed=speed, label=paths[0].name)


def _imported(paths: list[Path]) -> Trace:
    from memdoc.importers import load_any

    # Several files: the trace that failed first (or the first) is the one worth watching.
    return load_any(paths).primary
