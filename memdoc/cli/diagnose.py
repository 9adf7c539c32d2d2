"""`memdoc diagnose`: why a run ran out of memory and what to change, in the terminal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memdoc.cli.common import (
    FINDINGS_EXIT_HELP,
    failing_in_one_line,
    findings_exit_code,
)

if TYPE_CHECKING:
    from memdoc.trace.reader import Run, Trace

NAME = "diagnose"
HELP = "say why a run ran out of memory and what to change (terminal; --json for tools)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = FINDINGS_EXIT_HELP
    parser.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="trace files (one per rank or node), or a folder of them (memdoc run -o DIR/)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"oom": ..., "findings": [...], "run": {...}}',
    )


@failing_in_one_line
def run(args: argparse.Namespace) -> int:
    # Imported here: every `memdoc` command builds the parser, few need the report.
    from memdoc.cli.common import print_unpadded
    from memdoc.cli.folders import traces_of_one_run
    from memdoc.report.data import ReportData
    from memdoc.report.inputs import load_inputs
    from memdoc.report.terminal import render_terminal
    from memdoc.rules.engine import diagnose_run, to_json

    paths = traces_of_one_run(args.traces)
    loaded = load_inputs(paths)
    findings = diagnose_run(loaded)
    oom = loaded.primary.ending_oom()
    code = findings_exit_code(oom is not None or bool(findings))
    if args.json:
        print(json.dumps({**to_json(oom, findings), "run": run_summary(loaded)}, indent=2))
        return code
    data = ReportData.from_run(loaded, findings, title=_title(args.traces))
    print_unpadded(lambda console: render_terminal(data, console))
    return code


def run_summary(loaded: Run) -> dict[str, Any]:
    """How long the run took, its peaks per device and on the host, its steps and its end."""
    summary = _trace_summary(loaded.primary)
    if len(loaded.traces) > 1:
        summary["ranks"] = [_trace_summary(trace) for trace in loaded.traces]
    return summary


def _trace_summary(trace: Trace) -> dict[str, Any]:
    from memdoc.report.overview import build_overview

    overview = build_overview(trace)
    end = trace.exit
    ended: dict[str, Any] = {"kind": overview.ending.kind, "text": overview.ending.text}
    if end is not None:
        ended.update(exit_code=end.exit_code, signal=end.signal, status=end.status)
    ended["oom"] = trace.ending_oom() is not None
    out: dict[str, Any] = {
        "duration_s": round(overview.duration_s, 3),
        "steps": overview.steps,
        "devices": [
            {
                "index": gpu.index,
                "name": gpu.name,
                "total_bytes": gpu.total_bytes,
                "peak_held_bytes": gpu.peak_held_bytes,
                "peak_used_bytes": gpu.peak_used_bytes,
            }
            for gpu in overview.gpus
        ],
        "host": {
            "peak_rss_bytes": overview.host_peak_rss_bytes,
            "total_bytes": overview.host_total_bytes,
            "cgroup_limit_bytes": overview.cgroup_limit_bytes,
        },
        "ended": ended,
    }
    if overview.rank is not None:
        out["rank"] = overview.rank
    return out


def _title(given: list[str]) -> str:
    """A folder's name for a run read from a folder, else the first trace's."""
    return Path(given[0]).name or str(given[0])
