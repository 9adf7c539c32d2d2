"""`memdoc run`: run a script, a module or any command under observation, no code change."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from memdoc.cli.common import check_output_path, warn
from memdoc.cli.serve import serving_metrics
from memdoc.errors import MemdocError
from memdoc.metrics.identity import job_identity

if TYPE_CHECKING:
    from memdoc.run.parent import RunOptions

NAME = "run"
HELP = "run a Python script, module or command and record its memory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "memdoc run [options] script.py [args...]\n"
        "       memdoc run [options] -m module [args...]\n"
        "       memdoc run [options] -- command [args...]"
    )
    parser.add_argument(
        "-o",
        "--output",
        help="trace file (default: memdoc-<time>-<pid>.memdoc); a folder (ending in /, or "
        "existing) gets one trace per node named by host, node rank and pid",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=0.1,
        metavar="S",
        help="sampling interval in seconds (default 0.1)",
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite the trace and report if they exist"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing but errors at the end"
    )
    parser.add_argument(
        "--report", action="store_true", help="also write the HTML report (beside the trace)"
    )
    parser.add_argument("--report-file", metavar="FILE", help="write the HTML report here")
    parser.add_argument("--live", action="store_true", help="show the live dashboard while it runs")
    parser.add_argument("--no-nvml", action="store_true", help="do not query the NVIDIA driver")
    parser.add_argument(
        "--record-allocations",
        action="store_true",
        help="record PyTorch allocation history (Python stacks) and save a snapshot at OOM",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port while the program runs (0: any free port)",
    )
    parser.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics are served on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    parser.add_argument(
        "program", nargs=argparse.REMAINDER, help="script.py [args...], or -- command"
    )


def program_command(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(the command to start, the command as the user typed it) for the three forms."""
    rest = list(args.program)
    if args.module:
        return [sys.executable, "-m", args.module, *rest], ["-m", args.module, *rest]
    if rest and rest[0] == "--":
        rest = rest[1:]
        if not rest:
            raise MemdocError("no command after --", hint="memdoc run -- torchrun train.py")
        if shutil.which(rest[0]) is None and not Path(rest[0]).exists():
            raise MemdocError(f"{rest[0]}: command not found")
        return rest, rest
    if not rest:
        raise MemdocError("nothing to run", hint="memdoc run train.py [args...]")
    script = rest[0]
    if not Path(script).is_file():
        raise MemdocError(
            f"{script}: no such file", hint="for a command, put it after --: memdoc run -- cmd"
        )
    return [sys.executable, *rest], rest


def run(args: argparse.Namespace) -> int:
    from memdoc.run.parent import RunOptions

    if not args.interval > 0:
        raise MemdocError("--interval must be a positive number of seconds")
    command, display = program_command(args)
    identity = job_identity(os.environ, command)
    output = _output_path(args.output, identity.trace_name(os.getpid()))
    check_output_path(output, force=args.force)
    report_path = _report_path(args, output)
    options = RunOptions(
        command=command,
        display_command=display,
        output=output,
        interval_s=args.interval,
        force=args.force,
        nvml=not args.no_nvml,
        record_allocations=args.record_allocations,
        node_rank=identity.node_rank,
    )
    with serving_metrics(args, output, identity):
        return _run(options, report_path, args)


def _run(options: RunOptions, report_path: Path | None, args: argparse.Namespace) -> int:
    from memdoc.run.parent import run_program

    if args.live:
        return _run_live(options, report_path, args)
    result = run_program(options)
    _say_how_it_ended(result.signal, quiet=args.quiet)
    _finish(result.trace_path, result.writer_error, report_path, quiet=args.quiet, force=args.force)
    return result.status


def _output_path(output: str | None, name_in_folder: str) -> Path:
    """The trace path: as given, a unique name in a folder (one per node of a job), or a
    name from the time and pid."""
    if output is None:
        return Path(f"memdoc-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.memdoc")
    if output.endswith(("/", os.sep)) or Path(output).is_dir():
        folder = Path(output)
        try:
            folder.mkdir(parents=True, exist_ok=True)  # every node may create it at once
        except OSError as exc:
            raise MemdocError(f"cannot create folder {folder} ({exc.strerror or exc})") from None
        return folder / name_in_folder
    return Path(output)


def _say_how_it_ended(sig: int | None, *, quiet: bool) -> None:
    if sig is None or quiet:
        return
    import signal

    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    print(f"memdoc: the program was killed by {name} ({sig})", file=sys.stderr)


def _report_path(args: argparse.Namespace, output: Path) -> Path | None:
    if not args.report and not args.report_file:
        return None
    path = Path(args.report_file) if args.report_file else output.with_suffix(".html")
    check_output_path(path, force=args.force)
    return path


def _finish(
    trace: Path, writer_error: str | None, report: Path | None, *, quiet: bool, force: bool
) -> None:
    if writer_error:
        warn(writer_error)
    if report is not None:
        try:
            from memdoc.report.html import write_report

            write_report([trace], report, force=True)
        except MemdocError as exc:
            warn(f"no report: {exc.message}")
            report = None
    if quiet:
        return
    try:
        from memdoc.report.summary import print_end_of_run

        print_end_of_run([trace], stream=sys.stderr, report_path=report)
    except Exception as exc:
        print(f"memdoc: trace written to {trace} (no diagnosis: {exc})", file=sys.stderr)


def _run_live(options: object, report: Path | None, args: argparse.Namespace) -> int:
    import threading

    from memdoc.run.parent import RunOptions, RunResult, run_program

    assert isinstance(options, RunOptions)
    options.output_log = options.output.with_suffix(".log")
    outcome: dict[str, RunResult | BaseException] = {}

    def target() -> None:
        try:
            outcome["result"] = run_program(options)
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="memdoc-run", daemon=True)
    worker.start()
    deadline = time.monotonic() + 5
    while not options.output.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        from memdoc.tui.app import run_live_dashboard

        run_live_dashboard(options.output, log_path=options.output_log)
    except ImportError as exc:
        warn(f"no dashboard ({exc}); the program runs on")
    worker.join()  # the program goes on when the dashboard is closed
    error = outcome.get("error")
    if isinstance(error, BaseException):
        raise error
    result = outcome["result"]
    assert isinstance(result, RunResult)
    _say_how_it_ended(result.signal, quiet=args.quiet)
    if options.output_log is not None and options.output_log.exists():
        sys.stdout.write(options.output_log.read_text(errors="replace"))
    _finish(result.trace_path, result.writer_error, report, quiet=args.quiet, force=args.force)
    return result.status
