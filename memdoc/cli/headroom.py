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
    from memdoc.forecast.headroom import HeadroomFit
    from memdoc.run.headroom import Headroom

# memdoc.run.headroom's defaults, written here so that building the parser imports no
# search (a test holds the two equal).
DEFAULT_STEPS = 8
DEFAULT_REFINE = 8

NAME = "headroom"
HELP = "probe batch sizes until one trains and the next runs out: the largest that fits"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "memdoc headroom [options] -- command ... {} ..."
    parser.add_argument(
        "--sizes",
        default="8,16,32",
        metavar="N,N,...",
        help="sizes to probe, two or three, put where {} is (default 8,16,32)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        metavar="N",
        help=f"steps each probe runs at least, then on until its peak stops rising (default "
        f"{DEFAULT_STEPS})",
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
        default=DEFAULT_REFINE,
        metavar="N",
        help="probes after the first sizes, growing to a size that runs out, then bisecting "
        f"(default {DEFAULT_REFINE}; 0: the first sizes only)",
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
    limit = "no limit recorded"
    if result.limit_bytes is not None:
        limit = f"limit {format_bytes(result.limit_bytes, 2)} ({result.limit_label})"
    lines = [f"memdoc headroom: {limit}"]
    for p in result.probes:
        if p.oom:
            lines.append(f"  size {p.size:>6}: ran out of memory")
        elif p.crashed:
            lines.append(f"  size {p.size:>6}: crashed (exit status {p.status})")
        elif p.reading is not None:
            settled = "" if p.settled is None else ", settled" if p.settled else ", still rising"
            lines.append(
                f"  size {p.size:>6}: peak {format_bytes(p.reading.peak_bytes, 2)} "
                f"over {p.steps} steps{settled}"
            )
    fit = result.fit
    if fit is not None:
        lines.append(
            f"  fit: {format_bytes(fit.fixed_bytes, 2)} fixed + "
            f"{format_bytes(fit.per_size_bytes)} per unit of size (worst point "
            f"{format_percent(fit.max_relative_error)} off the line); {_fit_says(fit)}"
        )
    for note in result.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  {_answer_line(result)}")
    size = result.largest_size
    if fit is None or size is None or fit.per_size_bytes <= 0:
        return lines
    predicted = fit.predicted_bytes(size)
    share = fit.per_size_bytes * size / predicted if predicted else 0.0
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


def _fit_says(fit: HeadroomFit) -> str:
    if fit.largest_size is None:
        return "it finds no limit (the peaks do not rise with the size)"
    low, high = fit.largest_low, fit.largest_high
    spread = ""
    if low is not None and (low, high) != (fit.largest_size, fit.largest_size):
        spread = f" (range {low}–{high if high is not None else 'no limit'})"
    return f"it puts the limit near {fit.largest_size}{spread}"


def _answer_line(result: Headroom) -> str:
    size, too_big, k = result.largest_size, result.too_big, result.multiple_of
    kept = "at the limit itself"
    if result.margin > 0:
        kept = f"keeping {format_percent(result.margin)} of the limit free"
    if size is None:
        trained = [p.size for p in result.probes if p.fits(result.margin)]
        if trained:
            return f"no multiple of {k} fits: {max(trained)} trains, {too_big} does not ({kept})"
        return f"nothing fits: size {too_big}, the smallest probed, does not ({kept})"
    if too_big is None:
        return (
            f"largest size that fits: at least {size} (every probe trained, {kept}; "
            "probe larger sizes with --sizes or more probes with --refine)"
        )
    closed = "" if size + k >= too_big else " (the probes ended before the two met)"
    return (
        f"largest size that fits: {size} (measured: trains at {size}, {_fails(result)} at "
        f"{too_big}{closed}; {kept})"
    )


def _fails(result: Headroom) -> str:
    over = [p for p in result.probes if p.size == result.too_big]
    if any(p.oom for p in over):
        return "runs out"
    return "crashes" if any(p.crashed for p in over) else "goes over the margin"


def as_json(result: Headroom) -> dict[str, Any]:
    fit = result.fit
    return {
        "limit_bytes": result.limit_bytes,
        "limit": result.limit_label,
        "probes": [
            {
                "size": p.size,
                "steps": p.steps,
                "oom": p.oom,
                "crashed": p.crashed,
                "settled": p.settled,
                "peak_bytes": p.reading.peak_bytes if p.reading else None,
            }
            for p in result.probes
        ],
        "fixed_bytes": fit.fixed_bytes if fit else None,
        "per_size_bytes": fit.per_size_bytes if fit else None,
        "fit_largest_size": fit.largest_size if fit else None,
        "fit_range": [fit.largest_low, fit.largest_high] if fit else None,
        "margin": result.margin,
        "multiple_of": result.multiple_of,
        "largest_size": result.largest_size,
        "at_least": result.at_least,
        "too_big": result.too_big,
        "measured": result.measured,
        "dominant": fit.dominant if fit and result.largest_size is not None else None,
        "notes": list(result.notes),
    }
