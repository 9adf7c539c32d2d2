"""`python -m benchmarks.loops_score`: how often memdoc names the true cause of real loops.

Each program in `benchmarks/loops/` is a small training job written with a framework's own
loop (Keras `fit`, a jitted JAX step, the Hugging Face `Trainer`, Lightning, a batch-size
finder, torchrun), holding itself to a memory budget so that it fails in seconds on a CPU.
`programs.toml` says what each one really suffers from, written before memdoc ran on it.
Every program runs under `memdoc run`, then `memdoc diagnose --json` reads its trace:

- top-1: the first finding is the cause (or an equivalent slug in `also`);
- top-3: the cause is among the first three findings;
- for a run with no memory problem (cause "none"): no finding of confidence "likely" or
  stronger and no OOM forecast, for top-1 and top-3 alike.

memdoc runs as `python -m memdoc` with this interpreter, so PYTHONPATH decides which memdoc
is measured. Slow: about a minute per program on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import BENCHMARKS_DIR

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

LOOPS_DIR = BENCHMARKS_DIR / "loops"
PROGRAMS_PATH = LOOPS_DIR / "programs.toml"
SPLITS = ("dev", "held", "fresh", "fresh2", "fresh3", "fresh4", "fresh5", "fresh6", "fresh7")
# "all" is the tuning and reporting set, dev and held; "fresh", "fresh2", "fresh3", "fresh4",
# "fresh5", "fresh6" and "fresh7" were written later to measure how the diagnosis generalises,
# and run only when asked for by name, so that an ordinary run neither shows their results nor
# changes the totals of "all".
ALL = ("dev", "held")
TIMEOUT_S = 180
LIKELY = 0.6  # the lowest confidence that memdoc calls "likely"
NO_CAUSE = "none"


@dataclass(frozen=True)
class Program:
    name: str
    file: str
    loop: str
    cause: str
    why: str
    command: tuple[str, ...]
    ends: str
    split: str
    also: tuple[str, ...] = ()

    @property
    def right(self) -> set[str]:
        return {self.cause, *self.also}


def load_programs(path: Path = PROGRAMS_PATH) -> list[Program]:
    with path.open("rb") as stream:
        table = tomllib.load(stream)
    return [
        Program(
            name=name,
            **{
                **entry,
                "command": tuple(entry["command"]),
                "also": tuple(entry.get("also", ())),
            },
        )
        for name, entry in sorted(table.items())
    ]


@dataclass
class Result:
    """What memdoc saw of one program and said about it."""

    name: str
    split: str
    loop: str
    cause: str
    exit_status: int | None = None  # None: timed out
    as_designed: bool = False  # died or finished as `ends` says
    duration_s: float = 0.0
    steps: int | None = None
    ooms: int | None = None
    ending_oom: bool = False
    forecast: bool | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)  # rule, confidence
    top1: bool = False
    top3: bool = False
    problem: str = ""  # why memdoc gave no answer

    @property
    def slugs(self) -> list[str]:
        return [finding["rule"] for finding in self.findings]


def command_line(program: Program) -> list[str]:
    """The program's command with this interpreter and its files named in full."""
    out = []
    for i, arg in enumerate(program.command):
        if i == 0 and arg == "python":
            out.append(sys.executable)
        elif (LOOPS_DIR / arg).is_file():
            out.append(str(LOOPS_DIR / arg))
        else:
            out.append(arg)
    return out


def run_bounded(command: Sequence[str], cwd: Path, timeout_s: float) -> tuple[int | None, str]:
    """(exit status or None on time-out, stdout); a late run loses its whole process group."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    with subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return None, ""
        return process.returncode, out


# Run by the measured memdoc's interpreter, outside this repository, so that PYTHONPATH
# decides which trace reader reads the trace, as it decides which memdoc wrote it.
COUNT_TRACE = """
import json, sys
from pathlib import Path
from memdoc.trace import load_trace
trace = Path(sys.argv[1])
ooms, forecast = 0, False
for path in sorted(trace.glob("*.memdoc")) if trace.is_dir() else [trace]:
    loaded = load_trace(path)
    ooms += len(loaded.oom_events())
    forecast |= any(e.data.get("state") == "likely" for e in loaded.events("forecast"))
print(json.dumps([ooms, forecast]))
"""
MEMDOC_COMMIT = """
import subprocess
from pathlib import Path
import memdoc
done = subprocess.run(
    ["git", "-C", str(Path(memdoc.__file__).parent), "rev-parse", "HEAD"],
    capture_output=True, text=True, check=False,
)
print(done.stdout.strip())
"""


def trace_counts(trace: Path, folder: Path) -> tuple[int | None, bool | None]:
    """(OOM events recorded, whether an OOM forecast was made) read from the trace(s);
    (None, None) when the reader has changed shape: nothing is guessed."""
    _, out = run_bounded([sys.executable, "-c", COUNT_TRACE, str(trace)], folder, TIMEOUT_S)
    try:
        ooms, forecast = json.loads(out)
    except (json.JSONDecodeError, ValueError, TypeError):
        return None, None
    return int(ooms), bool(forecast)


def score(program: Program, folder: Path, timeout_s: float, kept: Path | None = None) -> Result:
    """Run `program` under memdoc and score the diagnosis; with `kept`, the trace a run with
    `--keep` left there is diagnosed again instead (the program does not run, and its exit
    status is the one the diagnosis reads from the trace)."""
    result = Result(program.name, program.split, program.loop, program.cause)
    trace = folder / f"{program.name}.memdoc"
    memdoc = [sys.executable, "-m", "memdoc"]
    started = time.monotonic()
    if kept is not None:
        trace = kept / f"{program.name}.memdoc"
    else:
        status, _ = run_bounded(
            [*memdoc, "run", "-q", "--force", "-o", str(trace), "--", *command_line(program)],
            folder,
            timeout_s,
        )
        _ended(result, program, status)
        if status is None:
            result.problem = f"timed out after {timeout_s:.0f} s"
    result.duration_s = round(time.monotonic() - started, 1)
    if not trace.exists():
        result.problem = result.problem or "no trace written"
        return result
    done, out = run_bounded([*memdoc, "diagnose", "--json", str(trace)], folder, timeout_s)
    (folder / f"{program.name}.json").write_text(out, encoding="utf-8")
    try:
        answer = json.loads(out)
    except json.JSONDecodeError:
        result.problem = f"diagnose gave no JSON (exit {done})"
        return result
    result.findings = [
        {"rule": f["rule"], "confidence": float(f["confidence"])}
        for f in answer.get("findings", [])
    ]
    run = answer.get("run") or {}
    if kept is not None:
        recorded = (run.get("ended") or {}).get("status")
        _ended(result, program, recorded if isinstance(recorded, int) else None)
    result.steps = run.get("steps")
    result.ending_oom = bool(answer.get("oom"))
    result.ooms, result.forecast = trace_counts(trace, folder)
    if program.cause == NO_CAUSE:
        quiet = all(finding["confidence"] < LIKELY for finding in result.findings)
        result.top1 = result.top3 = quiet and not result.forecast
    else:
        result.top1 = bool(result.slugs) and result.slugs[0] in program.right
        result.top3 = bool(program.right & set(result.slugs[:3]))
    return result


def _ended(result: Result, program: Program, status: int | None) -> None:
    """The run's exit status (None: it timed out), and whether it ended as designed."""
    result.exit_status = status
    result.as_designed = status is not None and (status == 0) == (program.ends == "finishes")


def plain(program: Program, folder: Path, timeout_s: float) -> str:
    """Run the program without memdoc: does it die or finish as designed, and how fast."""
    started = time.monotonic()
    status, _ = run_bounded(command_line(program), folder, timeout_s)
    took = time.monotonic() - started
    designed = status is not None and (status == 0) == (program.ends == "finishes")
    ended = "timeout" if status is None else str(status)
    verdict = "yes" if designed else "NO"
    return f"| {program.name} | {program.ends} | {ended} | {verdict} | {took:.0f} s |"


def row(result: Result) -> str:
    said = ", ".join(f"{f['rule']} {f['confidence']:.2f}" for f in result.findings[:3])
    ended = "timeout" if result.exit_status is None else str(result.exit_status)
    if not result.as_designed:
        ended += " (!)"
    ooms = "?" if result.ooms is None else str(result.ooms)
    steps = "?" if result.steps is None else str(result.steps)
    forecast = {None: "?", True: "yes", False: "-"}[result.forecast]
    return (
        f"| {result.name} | {result.split} | {result.loop} | {result.cause} | {ended} | "
        f"{steps} | {ooms} | {forecast} | {said or result.problem or '-'} | "
        f"{'hit' if result.top1 else 'miss'} | {'hit' if result.top3 else 'miss'} |"
    )


def totals(results: Sequence[Result]) -> dict[str, dict[str, Any]]:
    out = {}
    for split in (*SPLITS, "all"):
        chosen = [r for r in results if r.split == split or (split == "all" and r.split in ALL)]
        if not chosen:
            continue
        n = len(chosen)
        top1 = sum(r.top1 for r in chosen)
        top3 = sum(r.top3 for r in chosen)
        out[split] = {
            "programs": n,
            "top1": top1,
            "top3": top3,
            "top1_rate": round(top1 / n, 3),
            "top3_rate": round(top3 / n, 3),
        }
    return out


def keep(folder: Path, name: str, into: Path) -> None:
    """Copy a program's trace (or a cluster's folder of traces) and its diagnosis."""
    into.mkdir(parents=True, exist_ok=True)
    for found in folder.glob(f"{name}.*"):
        target = into / found.name
        if found.is_dir():
            shutil.copytree(found, target, dirs_exist_ok=True)
        else:
            shutil.copy2(found, target)


def memdoc_commit(folder: Path) -> str | None:
    """The commit of the memdoc being measured, when it is a git checkout."""
    _, out = run_bounded([sys.executable, "-c", MEMDOC_COMMIT], folder, 60)
    return out.strip() or None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loops_score", description=__doc__)
    parser.add_argument(
        "--split",
        choices=(*SPLITS, "all"),
        default="all",
        help="all: dev and held (the fresh sets run only when named)",
    )
    parser.add_argument("--only", action="append", metavar="NAME", help="one program (repeatable)")
    parser.add_argument("--json", metavar="OUT", help="write every result and the totals here")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per program")
    parser.add_argument(
        "--plain", action="store_true", help="run the programs without memdoc, to check them"
    )
    parser.add_argument(
        "--again",
        metavar="DIR",
        help="run nothing: diagnose again the traces a run with --keep DIR left, with the "
        "memdoc measured now",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep each program's trace and diagnosis (NAME.memdoc, NAME.json) in DIR, so "
        "that an odd result can be read again",
    )
    args = parser.parse_args(argv)
    programs = [
        p
        for p in load_programs()
        if (p.split == args.split or (args.split == "all" and p.split in ALL))
        and (not args.only or p.name in args.only)
    ]
    if not programs:
        parser.error("no program chosen")
    if args.plain:
        print("| program | designed to | exit | as designed | time |\n|---|---|---|---|---|")
        with tempfile.TemporaryDirectory(prefix="memdoc-loops-") as tmp:
            for program in programs:
                print(plain(program, Path(tmp), args.timeout), flush=True)
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="memdoc-loops-") as tmp:
        commit = memdoc_commit(Path(tmp))
        print(f"memdoc at commit {commit or 'unknown'}\n")
        print(
            "| program | split | loop | cause | exit | steps | OOMs | forecast "
            "| first findings (confidence) | top-1 | top-3 |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for program in programs:
            folder = Path(tmp) / program.name
            folder.mkdir()
            again = Path(args.again) if args.again else None
            results.append(score(program, folder, args.timeout, kept=again))
            print(row(results[-1]), flush=True)
            if args.keep:
                keep(folder, program.name, Path(args.keep))
    summary = totals(results)
    print()
    for split, figures in summary.items():
        print(
            f"{split}: {figures['programs']} programs, "
            f"top-1 {figures['top1']} ({figures['top1_rate']:.0%}), "
            f"top-3 {figures['top3']} ({figures['top3_rate']:.0%})"
        )
    if args.json:
        data = {
            "memdoc_commit": commit,
            "results": [asdict(r) for r in results],
            "totals": summary,
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
