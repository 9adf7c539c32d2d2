"""`memdoc headroom`: the largest batch size that fits, from a few short runs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from memdoc.cli.common import ExitStatus, seconds
from memdoc.errors import InputError
from memdoc.run.group import PROBE_TIMEOUT_S
from memdoc.units import format_bytes, format_percent

if TYPE_CHECKING:
    from memdoc.run.headroom import Headroom

NAME = "headroom"
HELP = "run a few steps at a few batch sizes and say the largest that fits"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "memdoc headroom [options] -- command ... {} ..."
    parser.add_argument(
        "--sizes",
        default="8,16,32",
        metavar="N,N,...",
        help="sizes to probe, two or three, put where {} is (default 8,16,32)",
    )
    parser.add_argument(
        "--steps", type=int, default=5, metavar="N", help="steps per probe (default 5)"
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.05,
        metavar="SHARE",
        help="share of the limit kept free (default 0.05)",
    )
    parser.add_argument(
        "--multiple-of", type=int, default=1, metavar="K", help="answer a multiple of K"
    )
    parser.add_argument(
        "--refine",
        type=int,
        default=4,
        metavar="N",
        help="probes at the predicted answer, refitting near it (default 4; 0: fit only)",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep each probe's trace and output in DIR (created if missing); without it they "
        "go to a temporary folder removed at the end",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=PROBE_TIMEOUT_S,
        metavar="S",
        help=f"end a probe still running after S seconds (default {PROBE_TIMEOUT_S:g})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- command with {}")


def parse_sizes(text: str) -> list[int]:
    """Raises:
    InputError: not a comma-separated list of whole numbers."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--sizes {text!r}: give whole numbers, e.g. 8,16,32") from None


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memdoc.run.group import Terminated, ending_signals_raise
    from memdoc.run.headroom import find_headroom

    template = list(args.program)
    if template and template[0] == "--":
        template = template[1:]
    # A SIGTERM or SIGHUP ends the probe running (its whole process group) and the search.
    try:
        with ending_signals_raise():
            result = find_headroom(
                template,
                parse_sizes(args.sizes),
                steps=args.steps,
                margin=args.margin,
                multiple_of=args.multiple_of,
                workdir=Path(args.keep) if args.keep else None,
                refine=args.refine,
                timeout_s=args.timeout,
            )
    except Terminated as ended:
        return ExitStatus(128 + ended.signum, ended.signum)
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        sys.stdout.write("\n".join(text_lines(result)) + "\n")
    return 0


def text_lines(result: Headroom) -> list[str]:
    fit = result.fit
    lines = [f"memdoc headroom: limit {format_bytes(fit.limit_bytes, 2)} ({result.limit_label})"]
    for p in result.probes:
        if p.oom:
            lines.append(f"  size {p.size:>6}: ran out of memory")
        elif p.reading is not None:
            lines.append(
                f"  size {p.size:>6}: peak {format_bytes(p.reading.peak_bytes, 2)} "
                f"over {p.steps} steps"
            )
    lines.append(
        f"  fit: {format_bytes(fit.fixed_bytes, 2)} fixed + {format_bytes(fit.per_size_bytes)} "
        f"per unit of size (worst point {format_percent(fit.max_relative_error)} off the line)"
    )
    for note in result.notes:
        lines.append(f"  note: {note}")
    size = fit.largest_size
    if size is None:
        lines.append(
            f"  nothing fits: the fixed part alone needs {format_bytes(fit.fixed_bytes)} of "
            f"{format_bytes(fit.usable_bytes)} usable"
        )
        return lines
    predicted = fit.predicted_bytes(size)
    how = "measured" if result.measured else "extrapolated"
    lines.append(
        f"  largest size that fits: {size} ({how}: about {format_bytes(predicted, 2)}, keeping "
        f"{format_percent(fit.margin)} of the limit free)"
    )
    per_size = fit.per_size_bytes * size
    share = per_size / predicted if predicted else 0.0
    if fit.dominant == "per-sample":
        lines.append(
            f"  the per-sample term dominates ({format_percent(share)}): activations; "
            "activation checkpointing or mixed precision buys a larger batch"
        )
    else:
        lines.append(
            f"  the fixed term dominates ({format_percent(1 - share)}): weights, gradients, "
            "optimizer state, libraries; shrinking those buys more than the batch does"
        )
    return lines


def as_json(result: Headroom) -> dict[str, Any]:
    fit = result.fit
    return {
        "limit_bytes": fit.limit_bytes,
        "limit": result.limit_label,
        "probes": [
            {
                "size": p.size,
                "steps": p.steps,
                "oom": p.oom,
                "peak_bytes": p.reading.peak_bytes if p.reading else None,
            }
            for p in result.probes
        ],
        "fixed_bytes": fit.fixed_bytes,
        "per_size_bytes": fit.per_size_bytes,
        "margin": fit.margin,
        "largest_size": fit.largest_size,
        "measured": result.measured,
        "dominant": fit.dominant,
        "notes": list(result.notes),
    }
