"""`memdoc top`: every GPU process on this machine with its memory, and host memory, live."""

from __future__ import annotations

import argparse

from memdoc.cli.live import require_terminal
from memdoc.errors import MemdocError

NAME = "top"
HELP = "show every GPU process on this machine and the memory ledger, live (like nvitop)"

MIN_INTERVAL_S = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between samples (default 1)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.interval >= MIN_INTERVAL_S:
        raise MemdocError(f"--interval must be at least {MIN_INTERVAL_S:g} s")
    require_terminal()
    from memdoc.tui.app import make_app
    from memdoc.tui.system import SystemSource

    app = make_app(SystemSource(args.interval))
    app.run()
    return app.return_code or 0
