"""`memdoc run`: run a script, a module or any command under observation, no code change."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from memdoc.cli.common import ExitStatus, check_output_path, seconds, seconds_or_zero, warn
from memdoc.cli.serve import METRICS_GRACE_S, serving_metrics
from memdoc.errors import MemdocError
from memdoc.files import output_folder
from memdoc.printable import printable

if TYPE_CHECKING:
    from memdoc.run.parent import RunOptions

NAME = "run"
REPORT_SUFFIXES = (".html", ".htm")
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
        type=seconds,
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
    reports = parser.add_mutually_exclusive_group()
    reports.add_argument(
        "--report",
        action="store_true",
        help="also write the HTML report, beside the trace (run.memdoc -> run.html)",
    )
    reports.add_argument(
        "--report-to",
        metavar="FILE",
        help="also write the HTML report, to FILE (--report takes no file name)",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="show the live dashboard while it runs (q closes it and the program goes on, "
        "its output then printed; ctrl+c interrupts the program); the output is kept in "
        "TRACE.log",
    )
    parser.add_argument("--no-nvml", action="store_true", help="do not query the NVIDIA driver")
    parser.add_argument(
        "--record-allocations",
        action="store_true",
        help="record PyTorch allocation history (Python stacks) and save a snapshot at OOM",
    )
    parser.add_argument(
        "--forward-errors",
        action="store_true",
        help="before Python 3.12, also record the memory errors the program catches out of "
        "a PyTorch module's forward pass whatever its handler does, through a global forward "
        "hook (every module call then takes PyTorch's hooked path, a little slower); 3.12 "
        "and later see every caught error without it",
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
    parser.add_argument(
        "--metrics-grace",
        type=seconds_or_zero,
        default=METRICS_GRACE_S,
        metavar="S",
        help="keep serving the metrics this long after the program ended, so that a scrape "
        f"sees memdoc_running 0 and the final findings (default {METRICS_GRACE_S:g}; set it "
        "to the scrape interval)",
    )
    # Like python's -m, it ends memdoc's options: whatever follows is the module's own.
    parser.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE",
        help="run a module, like python -m; the arguments after it are the module's",
    )
    parser.add_argument(
        "program", nargs=argparse.REMAINDER, help="script.py [args...], or -- command"
    )


def program_command(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(the command to start, the command as the user typed it) for the three forms."""
    rest = list(args.program)
    if args.module is not None:
        if not args.module:
            raise MemdocError("-m needs a module name", hint="memdoc run -m pkg.train [args...]")
        given: list[str] = [*args.module, *rest]
        module, rest = given[0], given[1:]
        check_module(module)
        return [sys.executable, "-m", module, *rest], ["-m", module, *rest]
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
    if Path(script).suffix.lower() in REPORT_SUFFIXES:
        # `--report out.html train.py`: the report's name, taken for the program.
        raise MemdocError(
            f"{script} is not a Python program: --report takes no file name",
            hint=f"memdoc run --report-to {script} {' '.join(rest[1:]) or 'train.py'}",
        )
    # What python runs: a file (a script or a zip), or a folder with a __main__.py.
    if not (Path(script).is_file() or (Path(script) / "__main__.py").is_file()):
        raise MemdocError(
            f"{script}: no such file", hint="for a command, put it after --: memdoc run -- cmd"
        )
    return [sys.executable, *rest], rest


def check_module(module: str) -> None:
    """Refuse, before anything starts or is written, a module that `python -m` would not
    find here. Nothing is imported: only the finders are asked. Where they cannot tell, the
    program runs and says so itself.

    Raises:
        MemdocError: no module of that name, or a package without `__main__`.
    """
    try:
        problem = _module_problem(module)
    except Exception:
        return
    if problem is not None:
        raise MemdocError(
            problem, hint="python -m would fail the same way: check the name and the folder"
        )


def _module_problem(module: str) -> str | None:
    import importlib.machinery
    import importlib.util

    top, *rest = module.split(".")
    sys.path.insert(0, os.getcwd())  # where `python -m` looks first
    try:
        spec = importlib.util.find_spec(top)
    finally:
        del sys.path[0]
    name = top
    for part in rest:
        if spec is None or spec.submodule_search_locations is None:
            return f"no module named {printable(module)}"
        name = f"{name}.{part}"
        spec = importlib.machinery.PathFinder.find_spec(name, list(spec.submodule_search_locations))
    if spec is None:
        return f"no module named {printable(module)}"
    if spec.submodule_search_locations is not None:
        main = importlib.machinery.PathFinder.find_spec(
            f"{name}.__main__", list(spec.submodule_search_locations)
        )
        if main is None:
            return f"{printable(module)} is a package without __main__ (python -m cannot run it)"
    return None


def run(args: argparse.Namespace) -> int:
    from memdoc.run.parent import RunOptions

    command, display = program_command(args)
    from memdoc.metrics.identity import job_identity

    identity = job_identity(os.environ, command)
    output = _output_path(args.output, identity.trace_name(os.getpid()))
    check_output_path(output, force=args.force)
    # With the dashboard, the program's output goes to a log beside the trace.
    output_log = output.with_suffix(".log") if args.live else None
    if output_log is not None:
        from memdoc.cli.live import require_terminal

        check_output_path(output_log, force=args.force)  # the same rule as the trace's
        require_terminal()  # before the program starts: it would run with no one to see it
    report_path = _report_path(args, output)
    options = RunOptions(
        command=command,
        display_command=display,
        output=output,
        interval_s=args.interval,
        force=args.force,
        nvml=not args.no_nvml,
        record_allocations=args.record_allocations,
        forward_errors=args.forward_errors,
        node_rank=identity.node_rank,
        output_log=output_log,
        warm_up=_ending_loader(quiet=args.quiet, report=report_path is not None),
    )
    with serving_metrics(args, output, identity):
        return _run(options, report_path, args)


def _run(options: RunOptions, report_path: Path | None, args: argparse.Namespace) -> int:
    if args.live:
        from memdoc.cli.run_live import run_live

        result = run_live(options)
    else:
        from memdoc.run.parent import run_program

        result = run_program(options)
    _finish(result.trace_path, result.writer_error, report_path, args)
    return ExitStatus(result.status, result.signal)


def _ending_loader(*, quiet: bool, report: bool) -> Callable[[], None] | None:
    """What the end of the run imports (the summary, the report writer), to import while
    the program runs: a short program then does not wait for it."""
    modules = ([] if quiet else ["memdoc.report.summary"]) + (
        ["memdoc.report.html"] if report else []
    )
    if not modules:
        return None

    def load() -> None:
        for name in modules:
            importlib.import_module(name)

    return load


def _output_path(output: str | None, name_in_folder: str) -> Path:
    """The trace path: as given, a unique name in a folder (one per node of a job), or a
    name from the time and pid."""
    if output is None:
        return Path(f"memdoc-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.memdoc")
    if output.endswith(("/", os.sep)) or Path(output).is_dir():
        # Every node may create it at once; the same checks as `headroom --keep`.
        return output_folder(Path(output)) / name_in_folder
    return Path(output)


def _report_path(args: argparse.Namespace, output: Path) -> Path | None:
    if not args.report and not args.report_to:
        return None
    path = Path(args.report_to) if args.report_to else output.with_suffix(".html")
    check_output_path(path, force=args.force)
    return path


def _finish(
    trace: Path, writer_error: str | None, report: Path | None, args: argparse.Namespace
) -> None:
    quiet = args.quiet
    if writer_error:
        warn(writer_error)
    if args.record_allocations and not quiet:
        _say_if_no_cuda(trace)
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
        said = printable(f"memdoc: trace written to {trace} (no diagnosis: {exc})")
        print(said, file=sys.stderr)


def _say_if_no_cuda(trace: Path) -> None:
    """--record-allocations on a run that never used CUDA recorded nothing: say why."""
    from memdoc.collectors.pytorch import CUDA_STATUS_NAME
    from memdoc.trace import load_trace

    try:
        statuses = load_trace(trace).collectors()
    except MemdocError:
        return
    if not any(s.name == CUDA_STATUS_NAME and s.available for s in statuses):
        print(
            "memdoc: --record-allocations applies to PyTorch on CUDA only; no process of this "
            "run used CUDA, so nothing was recorded",
            file=sys.stderr,
        )
