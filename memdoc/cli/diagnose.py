"""`memdoc diagnose`: why a run ran out of memory and what to change, in the terminal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memdoc.cli.common import expand_folders

NAME = "diagnose"
HELP = "say why a run ran out of memory and what to change (terminal; --json for tools)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="trace files (one per rank or node), or a folder of them (memdoc run -o DIR/)",
    )
    parser.add_argument(
        "--json", action="store_true", help='print one JSON object: {"oom": ..., "findings": [...]}'
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: every `memdoc` command builds the parser, few need the report.
    from rich.console import Console

    from memdoc.report.data import ReportData
    from memdoc.report.inputs import load_inputs
    from memdoc.report.terminal import render_terminal
    from memdoc.rules.engine import diagnose_run, to_json

    paths = expand_folders(args.traces)
    loaded = load_inputs(paths)
    findings = diagnose_run(loaded)
    if args.json:
        print(json.dumps(to_json(loaded.primary.ending_oom(), findings), indent=2))
        return 0
    data = ReportData.from_run(loaded, findings, title=_title(args.traces))
    render_terminal(data, Console(highlight=False))
    return 0


def _title(given: list[str]) -> str:
    """A folder's name for a run read from a folder, else the first trace's."""
    return Path(given[0]).name or str(given[0])
