"""`memdoc explain`: why a job ran out of memory, from an error text or log alone."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from memdoc.cli.common import (
    FINDINGS_EXIT_HELP,
    failing_in_one_line,
    findings_exit_code,
    print_unpadded,
    read_text_input,
    warn,
)
from memdoc.errors import MemdocError
from memdoc.kinds import OomKind
from memdoc.units import format_percent

# The rules, the trace reader and rich are imported when the command runs: every `memdoc`
# command builds this module's parser, and `memdoc --version` should not pay for them.
if TYPE_CHECKING:
    from rich.console import Console

    from memdoc.rules.engine import Explanation
    from memdoc.trace.model import OomInfo

NAME = "explain"
HELP = "explain an out-of-memory error from its text (a file, a log, or stdin)"
NO_MEMORY_ERROR = "No memory error found in this text."
# Weaker findings are named in one line (all of them are in --json).
SHOWN_IN_FULL = 0.25
_KINDS = {
    OomKind.ALLOCATOR: "out of memory",
    OomKind.COMPILE: "out of memory in a compiled program",
    OomKind.HOST_KILL: "killed (host out of memory)",
    OomKind.HOST_ALLOC: "host memory allocation failed",
    OomKind.SHM: "out of shared memory",
    OomKind.DATALOADER_KILLED: "DataLoader worker died",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = FINDINGS_EXIT_HELP
    parser.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="error text or log file; - (or a pipe) for stdin; only its last 1 MiB is read",
    )
    parser.add_argument(
        "--json", action="store_true", help='print one JSON object: {"oom": ..., "findings": [...]}'
    )


@failing_in_one_line
def run(args: argparse.Namespace) -> int:
    from memdoc.rules.engine import explain_text, to_json
    from memdoc.trace.reader import looks_like_trace

    if args.file is None and sys.stdin.isatty():
        raise MemdocError(
            "no error text given",
            hint="memdoc explain crash.log, or pipe it in: python train.py 2>&1 | memdoc explain",
        )
    if args.file not in (None, "-") and looks_like_trace(args.file):
        raise MemdocError(
            f"{args.file} is a memdoc trace, not an error text",
            hint=f"memdoc diagnose {args.file}",
        )
    tail = read_text_input(args.file)
    result = explain_text(tail.text)
    if result.oom is not None and result.oom.line is not None:
        # The line of the whole file, not of the tail that was read.
        result = replace(result, oom=replace(result.oom, line=tail.line_number(result.oom.line)))
    for warning in result.warnings:
        warn(warning)
    code = findings_exit_code(result.oom is not None or bool(result.findings))
    if args.json:
        print(json.dumps(to_json(result.oom, result.findings), indent=2))
        return code
    print_unpadded(lambda console: render(result, console))
    return code


def render(result: Explanation, console: Console) -> None:
    """The headline, the plain-words paragraph, then the findings best first."""
    from rich.console import Group
    from rich.text import Text

    from memdoc.report.terminal import findings_view
    from memdoc.rules.engine import explain_in_words

    if result.oom is None:
        console.print(NO_MEMORY_ERROR)
        if result.not_memory is not None:
            console.print(Text(f"Not read as a memory error: {result.not_memory}."))
        return
    console.print(Text(headline(result.oom), style="bold red"))
    console.print(Text(explain_in_words(result.oom)))  # op names carry [brackets]
    if result.findings:
        shown = [f for f in result.findings if f.confidence >= SHOWN_IN_FULL]
        shown = shown or result.findings[:1]
        console.print(findings_view(shown))
        weaker = [f for f in result.findings if f not in shown]
        if weaker:
            names = "; ".join(f"{f.code} {f.rule} ({format_percent(f.confidence)})" for f in weaker)
            console.print(Text(f"Less likely: {names}", style="dim"))
        console.print(Text("Each cause in full: memdoc rules SLUG", style="dim"))
    else:
        console.print(
            Group(
                Text(""),
                Text("No rule matched this error; `memdoc run` records what the text cannot show."),
            )
        )


def headline(oom: OomInfo) -> str:
    """ "PyTorch: out of memory on GPU 0 (line 12)" and the like."""
    from memdoc.rules.facts import framework_name
    from memdoc.rules.words import disguise_headline

    who = framework_name(oom.framework) if oom.framework not in ("unknown", "host") else ""
    if oom.kind == OomKind.DISGUISED:
        what = disguise_headline(oom)
    else:
        what = _KINDS.get(oom.kind, "out of memory")
    where = ""
    if oom.device is not None and oom.device >= 0:
        where = f" on {(oom.device_type or 'gpu').upper()} {oom.device}"
    rank = f" (rank {oom.rank})" if oom.rank is not None else ""
    line = f", line {oom.line}" if oom.line is not None and oom.line > 1 else ""
    prefix = f"{who}: " if who else ""
    text = f"{prefix}{what}{where}{rank}{line}"
    return text[0].upper() + text[1:]
