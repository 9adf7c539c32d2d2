"""`python -m benchmarks [--quick] [--only NAME]`: measure memdoc, print a table, write JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.agent_cost import agent_cost_group
from benchmarks.analysis import analysis_group
from benchmarks.dashboard import dashboard_group
from benchmarks.harness import BENCHMARKS_DIR, Context, Figure, Group, unavailable
from benchmarks.overhead import overhead_group
from benchmarks.parent_rss import parent_rss_group
from benchmarks.scrape import scrape_group
from benchmarks.start import start_group
from benchmarks.tick import tick_group
from benchmarks.trace_io import trace_group

# In the order they run: the noisy, long ones last.
GROUPS: dict[str, Group] = {
    "start": start_group,
    "tick": tick_group,
    "trace": trace_group,
    "analysis": analysis_group,
    "dashboard": dashboard_group,
    "scrape": scrape_group,
    "agent-cost": agent_cost_group,
    "overhead": overhead_group,
    "parent-rss": parent_rss_group,
}
DEFAULT_OUTPUT = BENCHMARKS_DIR / "results" / "latest.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter runs (~2 min)")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(GROUPS),
        metavar="NAME",
        help=f"run one group ({', '.join(GROUPS)}); repeatable",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where the JSON goes")
    return parser.parse_args(argv)


def run_group(name: str, group: Group, ctx: Context) -> list[Figure]:
    """A group's figures; a group that breaks becomes one figure saying how, never a crash."""
    print(f"== {name}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        figures = group(ctx)
    except Exception as exc:
        traceback.print_exc()
        figures = [unavailable(name, f"{name} group", "", f"failed: {type(exc).__name__}: {exc}")]
    print(f"   {name} took {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return figures


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 10_000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def table(figures: list[Figure]) -> str:
    rows = [("figure", "value", "unit", "spread (min..max)", "n", "target", "status", "note")]
    for f in figures:
        spread = f"{_number(f.spread[0])}..{_number(f.spread[1])}" if f.spread else ""
        target = f.target.text if f.target else ""
        rows.append(
            (f.title, _number(f.value), f.unit, spread, str(f.repeats), target, f.status, f.note)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Path, figures: list[Figure], args: argparse.Namespace, seconds: float) -> None:
    from memdoc import __version__

    payload = {
        "memdoc_version": __version__,
        "created_unix": time.time(),
        "quick": args.quick,
        "groups": args.only or list(GROUPS),
        "seconds": round(seconds, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "figures": [{**dataclasses.asdict(f), "status": f.status} for f in figures],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="memdoc-bench-") as scratch:
        ctx = Context(quick=args.quick, workdir=Path(scratch))
        for name, group in GROUPS.items():
            if args.only is None or name in args.only:
                figures += run_group(name, group, ctx)
    seconds = time.perf_counter() - start
    print(table(figures))
    mode = " (quick)" if args.quick else ""
    print(f"\n{len(figures)} figures in {seconds:.0f} s{mode}; JSON: {args.output}")
    write_json(args.output, figures, args, seconds)
    return 1 if any(f.status == "OVER" for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
