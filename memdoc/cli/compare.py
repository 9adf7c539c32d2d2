"""`memdoc compare BASE NEW`: two runs' memory side by side, and whether the new one keeps
to a budget (for CI: exit 3 when it does not). Either run may be a trace, a folder of
traces (`memdoc run -o DIR/`) or a baseline saved by `memdoc compare --save`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from memdoc.cli.common import (
    MEMORY_PROBLEM_FOUND,
    NO_MEMORY_PROBLEM,
    check_output_path,
    failing_in_one_line,
)
from memdoc.errors import InputError, MemdocError, OutputExistsError
from memdoc.printable import printable

if TYPE_CHECKING:
    from rich.console import Console

    from memdoc.budget.figures import Figures

NAME = "compare"
HELP = "compare two runs' memory, and fail a budget (for CI; --markdown for a pull request)"
EXIT_HELP = (
    "exit status: 0 within budget (or no budget given), 3 over budget, 1 memdoc itself "
    "failed, 2 usage error or an input it cannot use"
)
BUDGET_HELP = (
    "fail (exit 3) when the new run needs more than this over the base: a share (5%%) or "
    "bytes (64MiB), for every figure or one (peak_used=5%%, growth_per_step=0); repeat it. "
    "Growth per step is judged by what it adds over the new run's steps"
)
# A table per place, with the budget's verdict beside each figure: wider than the 80 columns
# rich gives a pipe, so that a CI log shows each row on one line.
PIPED_WIDTH = 120
# A baseline is a few KiB; a larger file is read as a trace.
MAX_BASELINE_BYTES = 16 << 20
READABLE = "compare reads memdoc traces, folders of them (memdoc run -o DIR/) and baselines " + (
    "saved by memdoc compare --save"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_HELP
    parser.add_argument(
        "base", metavar="BASE", help="the run compared against: a trace, a folder or a baseline"
    )
    parser.add_argument(
        "new",
        metavar="NEW",
        nargs="?",
        help="the run to judge (left out with --save: record BASE's figures as a baseline)",
    )
    parser.add_argument(
        "--fail-over", metavar="SPEC", action="append", default=[], help=BUDGET_HELP
    )
    parser.add_argument(
        "--any-program",
        action="store_true",
        help="compare runs of different programs too (refused by default)",
    )
    views = parser.add_mutually_exclusive_group()
    views.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"base", "new", "rows", "appeared", "gone", "notes", '
        '"over_budget"}',
    )
    views.add_argument(
        "--markdown",
        action="store_true",
        help="print a markdown table, for a pull request's comment",
    )
    parser.add_argument(
        "--save",
        metavar="PATH",
        help="write NEW's figures (BASE's when it is the only run given) as a baseline file",
    )
    parser.add_argument("--force", action="store_true", help="overwrite the --save file")


@failing_in_one_line
def run(args: argparse.Namespace) -> int:
    # Imported here: every `memdoc` command builds the parser, few need the rules.
    from memdoc.budget.compare import NotComparable, compare, parse_budget
    from memdoc.budget.render import render_terminal, to_json, to_markdown
    from memdoc.files import write_atomically

    try:
        budget = parse_budget(args.fail_over)
    except ValueError as exc:
        raise MemdocError(
            f"--fail-over: {exc}", hint="a share (5%), bytes (64MiB) or FIGURE=AMOUNT"
        ) from None
    if args.new is None and args.save is None:
        raise MemdocError(
            "compare needs two runs, BASE and NEW",
            hint="or one run with --save PATH, to record its figures as a baseline",
        )
    out = _save_path(args.save, force=args.force) if args.save else None
    base = read_figures(args.base)
    if args.new is None:
        assert out is not None
        write_atomically(out, json.dumps(base.to_dict(), indent=2) + "\n")
        print(f"memdoc: baseline of {base.program or args.base} written to {out}")
        return NO_MEMORY_PROBLEM
    new = read_figures(args.new)
    try:
        comparison = compare(base, new, budget, any_program=args.any_program)
    except NotComparable as exc:
        hint = (
            "pass --any-program to compare them anyway"
            if not args.any_program
            else "compare a run with a run or baseline of the same devices or host"
        )
        raise MemdocError(f"cannot compare {args.base} and {args.new}: {exc}", hint=hint) from None
    if out is not None:
        write_atomically(out, json.dumps(new.to_dict(), indent=2) + "\n")
    given = not budget.empty
    if args.json:
        print(json.dumps(to_json(comparison, budget_given=given), indent=2))
    elif args.markdown:
        print(to_markdown(comparison, budget_given=given), end="")
    else:
        print_wide(lambda console: render_terminal(comparison, console, budget_given=given))
    return MEMORY_PROBLEM_FOUND if given and comparison.over else NO_MEMORY_PROBLEM


def _save_path(given: str, *, force: bool) -> Path:
    try:
        return check_output_path(given, force=force)
    except OutputExistsError as exc:
        raise MemdocError(exc.message, hint="pass --force to overwrite it") from None


def print_wide(render: Callable[[Console], None]) -> None:
    """Render rich output to stdout, `PIPED_WIDTH` columns wide when piped (a CI log), and
    without the spaces rich pads each line with."""
    from memdoc.report.console import SafeConsole

    console = SafeConsole()
    if console.is_terminal:
        render(console)
        return
    console = SafeConsole(width=PIPED_WIDTH)
    with console.capture() as captured:
        render(console)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def read_figures(given: str) -> Figures:
    """The figures of a trace, a folder of one run's traces, or a baseline file.

    Raises:
        MemdocError: a missing or unreadable input, or one that is neither.
    """
    from memdoc.budget.figures import run_figures
    from memdoc.cli.folders import traces_of_one_run
    from memdoc.report.inputs import load_inputs
    from memdoc.report.overview import ending_of
    from memdoc.rules.engine import diagnose_run

    path = Path(given)
    if not path.exists():
        raise InputError(f"{given}: no such file or folder", hint=READABLE)
    if path.is_file():
        if path.stat().st_size == 0:
            raise InputError(f"{given}: an empty file", hint=READABLE)
        baseline = read_baseline(path)
        if baseline is not None:
            return baseline
    loaded = load_inputs(traces_of_one_run([given]))
    findings = diagnose_run(loaded)
    return run_figures(loaded.traces, findings, ended=ending_of(loaded.primary).kind, source=given)


def read_baseline(path: Path) -> Figures | None:
    """The figures in a baseline file; None when the file is not a JSON object (a trace).

    Raises:
        MemdocError: a JSON object that is not a baseline, or a baseline of another format.
    """
    from memdoc.budget.figures import BASELINE_FORMAT, Figures
    from memdoc.files import require_regular_file

    require_regular_file(path)
    try:
        with open(path, "rb") as stream:
            head = stream.read(4096)
            # A trace names its format on its first line; anything else not JSON is read
            # as the trace reader and the importers decide.
            if not head.lstrip().startswith(b"{") or b'"memdoc-trace"' in head.split(b"\n")[0]:
                return None
            whole = head + stream.read(MAX_BASELINE_BYTES + 1 - len(head))
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(whole) > MAX_BASELINE_BYTES:
        return None
    try:
        data = json.loads(whole)
    except (ValueError, RecursionError):
        return None  # a trace (one JSON object a line), or damage: the trace reader says
    if not isinstance(data, dict):
        return None
    if "memdoc_baseline" not in data:
        if data.get("format") == "memdoc-trace" or _importable(path):
            return None  # a trace of one line, or a profile memdoc imports
        raise InputError(
            f"{path}: a JSON file, but not a memdoc baseline (it has no memdoc_baseline)",
            hint=READABLE,
        )
    again = "save it again with this memdoc (memdoc compare --save PATH TRACE)"
    if data["memdoc_baseline"] != BASELINE_FORMAT:
        raise InputError(
            f"{path}: a memdoc baseline of format {printable(repr(data['memdoc_baseline']))}; "
            f"this memdoc reads format {BASELINE_FORMAT}",
            hint=again,
        )
    try:
        return Figures.from_dict(data, source=os.fspath(path))
    except ValueError as exc:
        raise InputError(f"{path}: {exc}", hint=again) from None


def _importable(path: Path) -> bool:
    """Whether a file is one of the profiles or logs memdoc imports (a trace of its own)."""
    from memdoc.importers import detect

    return detect(path, None) is not None
