"""`memdoc diagnose`: why a run ran out of memory and what to change, in the terminal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "diagnose"
HELP = "say why a run ran out of memory and what to change (terminal; --json for tools)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files (one per rank)")
    parser.add_argument(
        "--json", action="store_true", help='print one JSON object: {"oom": ..., "findings": [...]}'
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: every `memdoc` command builds the parser, few need the report.
    from memdoc.cli.common import print_unpadded
    from memdoc.report.data import ReportData
    from memdoc.report.inputs import load_inputs
    from memdoc.report.terminal import render_terminal
    from memdoc.rules.engine import diagnose_run, to_json

    loaded = load_inputs(args.traces)
    findings = diagnose_run(loaded)
    if args.json:
        print(json.dumps(to_json(loaded.primary.ending_oom(), findings), indent=2))
        return 0
    data = ReportData.from_run(loaded, findings, title=Path(args.traces[0]).name)
    print_unpadded(lambda console: render_terminal(data, console))
    return 0
