"""`memdoc import`: turn files other tools wrote into one memdoc trace, never running their code."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from memdoc.cli.common import check_output_path
from memdoc.errors import InputError
from memdoc.printable import printable
from memdoc.units import format_duration

NAME = "import"
HELP = (
    "convert PyTorch memory snapshots, nvidia-smi logs and profiler traces (PyTorch, JAX, "
    "TensorFlow) into a memdoc trace"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="files about one run; their kind is read from their content",
    )
    parser.add_argument("-o", "--output", required=True, metavar="TRACE", help="the trace to write")
    parser.add_argument("--force", action="store_true", help="overwrite TRACE if it exists")
    parser.add_argument(
        "--columns",
        metavar="FIELDS",
        help="field list of an nvidia-smi CSV log written without a header "
        "(e.g. timestamp,index,memory.used,memory.total)",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: every `memdoc` command builds this module's parser.
    from memdoc.importers import import_files, save_trace
    from memdoc.importers.smi_csv import parse_columns

    out = check_output_path(args.output, force=args.force)
    for name in args.files:
        if _same_file(Path(name), out):
            raise InputError(f"{name} is both an input and the output")
    columns = parse_columns(args.columns) if args.columns else None
    trace = import_files(args.files, columns)
    save_trace(trace, out, force=args.force)
    values = sum(
        len(s) for k in trace.series_keys() if (s := trace.series(k.metric, k.device, k.pid))
    )
    print(
        printable(f"memdoc: wrote {out}") + ": "
        f"{len(trace.devices())} device(s), {values} values, "
        f"{trace.event_count()} events over {format_duration(trace.duration_s)}"
    )
    return 0


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False
