"""`memdoc report`: one self-contained HTML report from one or more traces."""

from __future__ import annotations

import argparse
from pathlib import Path

from memdoc.cli.common import check_output_path
from memdoc.errors import MemdocError
from memdoc.printable import printable

NAME = "report"
HELP = "write the HTML post-mortem report of one or more traces (one self-contained file)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="trace files (one per rank or node), or a folder of them (memdoc run -o DIR/)",
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="where to write (default: TRACE with .html)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def default_output(trace: str) -> Path:
    """run.memdoc -> run.html, run.memdoc.gz -> run.html, beside the trace; a folder of
    traces, runs/ -> runs/report.html, inside it."""
    path = Path(trace)
    if path.is_dir():
        return path / "report.html"
    if path.suffix == ".gz":
        path = path.with_suffix("")
    return path.with_suffix(".html")


def run(args: argparse.Namespace) -> int:
    # Imported here: every `memdoc` command builds this module's parser.
    from memdoc.cli.folders import traces_of_one_run

    output = Path(args.output) if args.output else default_output(args.traces[0])
    traces = traces_of_one_run(args.traces)
    if any(_same_file(output, Path(t)) for t in traces):
        raise MemdocError(f"{output} is one of the inputs; not overwriting it", hint="pass -o FILE")
    check_output_path(output, force=args.force)
    from memdoc.report.html import write_report  # plotly and the rules: only when needed

    write_report(traces, output, force=args.force)
    print(printable(f"memdoc: report written to {output}"))
    return 0


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
