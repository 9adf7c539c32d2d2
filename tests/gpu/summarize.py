"""Plan and summarise `run_all.sh`: which examples to run, then each one's top finding.

    python -m tests.gpu.summarize plan            # name, script, why skipped ("" to run)
    python -m tests.gpu.summarize report OUTDIR   # summary.md and summary.json from the runs

`plan` lists GPU-only scenarios first (they are what a GPU machine is for); set
MEMDOC_EXAMPLES to a comma-separated list of names to run only those.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from memdoc.errors import MemdocError
from memdoc.rules.engine import diagnose
from memdoc.trace.reader import load_trace
from tests.examples.scenarios import Scenario, all_scenarios

RUNS_FILE = "runs.tsv"  # one line per scenario, written by run_all.sh
TIMEOUT_EXIT_CODES = (124, 137)  # what `timeout` returns when it stops (or kills) a command
_MODULE_NAMES = {"tensorflow": "TensorFlow", "torch": "PyTorch", "jax": "JAX"}


@dataclass(frozen=True)
class Outcome:
    """One scenario's line in the summary."""

    scenario: str
    expected: str
    result: str  # "pass", "fail" or "skipped"
    top: str | None = None
    confidence: float | None = None
    findings: tuple[str, ...] = ()
    exit_code: int | None = None
    memory_error: bool | None = None  # whether the trace recorded an OOM
    wall_s: int | None = None
    note: str = ""


def planned(names: str | None = None) -> list[Scenario]:
    """The scenarios to run, GPU-only ones first; `names` restricts them (comma-separated)."""
    scenarios = sorted(all_scenarios(), key=lambda s: (s.on_cpu, s.name))
    if names:
        wanted = {n.strip() for n in names.split(",") if n.strip()}
        scenarios = [s for s in scenarios if s.name in wanted]
    return scenarios


def skip_reason(
    scenario: Scenario,
    find_spec: Callable[[str], object | None] = importlib.util.find_spec,
) -> str:
    """Why a scenario cannot run here ("TensorFlow not installed"), or "" when it can."""
    missing = [m for m in scenario.needs if find_spec(m) is None]
    return ", ".join(f"{_MODULE_NAMES.get(m, m)} not installed" for m in missing)


def outcome(scenario: Scenario, run: list[str], outdir: Path) -> Outcome:
    """Judge one scenario from its runs.tsv fields and its trace."""
    if not run:
        return Outcome(scenario.name, scenario.rule, "skipped", note="not run")
    if run[0] == "skipped":
        return Outcome(scenario.name, scenario.rule, "skipped", note=run[1])
    exit_code, wall_s = int(run[1]), int(run[2])
    base = Outcome(scenario.name, scenario.rule, "fail", exit_code=exit_code, wall_s=wall_s)
    if exit_code in TIMEOUT_EXIT_CODES:
        return replace(base, note=f"timed out after {wall_s} s")
    try:
        trace = load_trace(outdir / f"{scenario.name}.memdoc")
    except MemdocError as exc:
        return replace(base, note=f"no trace: {exc}")
    findings = diagnose(trace)
    top = findings[0] if findings else None
    return replace(
        base,
        result="pass" if top is not None and top.rule == scenario.rule else "fail",
        top=top.rule if top else None,
        confidence=top.confidence if top else None,
        findings=tuple(f"{f.rule} {f.confidence:.2f}" for f in findings),
        memory_error=trace.ending_oom() is not None,
        note=top.summary if top else "no finding",
    )


def read_runs(outdir: Path) -> dict[str, list[str]]:
    runs: dict[str, list[str]] = {}
    path = outdir / RUNS_FILE
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            name, *fields = line.split("\t")
            runs[name] = fields
    return runs


def report(outdir: Path, scenarios: list[Scenario]) -> list[Outcome]:
    """Judge every scenario and write summary.json and summary.md into `outdir`."""
    runs = read_runs(outdir)
    outcomes = [outcome(s, runs.get(s.name, []), outdir) for s in scenarios]
    (outdir / "summary.json").write_text(
        json.dumps([asdict(o) for o in outcomes], indent=2) + "\n", encoding="utf-8"
    )
    (outdir / "summary.md").write_text(markdown(outcomes), encoding="utf-8")
    return outcomes


def markdown(outcomes: list[Outcome]) -> str:
    counts = {r: sum(o.result == r for o in outcomes) for r in ("pass", "fail", "skipped")}
    lines = [
        "# Example scenarios on a GPU",
        "",
        f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped.",
        "",
        "| scenario | expected rule | top finding | exit | memory error | result | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        top = f"`{o.top}` {o.confidence:.2f}" if o.top and o.confidence is not None else "-"
        error = "-" if o.memory_error is None else ("yes" if o.memory_error else "no")
        exit_code = "-" if o.exit_code is None else str(o.exit_code)
        note = o.note.replace("|", "/").replace("\n", " ")
        cells = (o.scenario, f"`{o.expected}`", top, exit_code, error, o.result, note)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.summarize")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plan")
    report_parser = sub.add_parser("report")
    report_parser.add_argument("outdir", type=Path)
    args = parser.parse_args(argv)
    scenarios = planned(os.environ.get("MEMDOC_EXAMPLES"))
    if args.command == "plan":
        for scenario in scenarios:
            print(f"{scenario.name}\t{scenario.script}\t{skip_reason(scenario)}")
        return 0
    outcomes = report(args.outdir, scenarios)
    print((args.outdir / "summary.md").read_text(encoding="utf-8"))
    return 1 if any(o.result == "fail" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
