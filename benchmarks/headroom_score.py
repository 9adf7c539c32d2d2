"""`python -m benchmarks.headroom_score`: is `memdoc headroom`'s answer the largest batch size
that really trains?

Each program in `benchmarks/headroom/` is a small real training job that takes its batch size
as its one argument and holds itself to a memory budget with an address-space cap.
`programs.toml` says, for each, the largest multiple of K that trains its steps in every
plain run (no memdoc) and that the next multiple fails: found with `--find-truth NAME`,
written down before memdoc headroom ever ran on the program. The score runs
`memdoc headroom --margin 0 --multiple-of K --json` on each program and says whether the
answer is the truth ("exact"), one multiple below it ("one below": safe, a little
wasteful), or anything else ("wrong"); it then runs the answer and the next multiple up
plainly, once each, to say whether the answer trains and the next size up fails.

memdoc runs as `python -m memdoc` with this interpreter, so PYTHONPATH decides which memdoc
is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import BENCHMARKS_DIR

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

HEADROOM_DIR = BENCHMARKS_DIR / "headroom"
PROGRAMS_PATH = HEADROOM_DIR / "programs.toml"
SPLITS = ("dev", "held")
RUN_TIMEOUT_S = 120  # one plain run of a program
HEADROOM_TIMEOUT_S = 600  # one whole search
TRUTH_RUNS = 3  # plain runs of the truth and of the next multiple up


@dataclass(frozen=True)
class Program:
    name: str
    file: str
    framework: str
    multiple_of: int
    truth: int
    sizes: str  # the sizes memdoc headroom starts from
    split: str
    why: str


def load_programs(path: Path = PROGRAMS_PATH) -> list[Program]:
    with path.open("rb") as stream:
        table = tomllib.load(stream)
    return [Program(name=name, **entry) for name, entry in sorted(table.items())]


def command(file: str, size: int | str) -> list[str]:
    return [sys.executable, str(HEADROOM_DIR / file), str(size)]


def run_bounded(argv: Sequence[str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status or None on a time-out, stdout, stderr); a late run loses its process
    group. memdoc's own variables are left out: a plain run is plain."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    with subprocess.Popen(
        argv,
        cwd=HEADROOM_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return None, "", ""
        return process.returncode, out, err


def trains(file: str, size: int, *, under_memdoc: bool = False) -> bool:
    """One run at `size` trains every step (the program prints "done" at its end): plain, or
    under `memdoc run` as a probe runs it."""
    argv = command(file, size)
    if under_memdoc:
        with tempfile.TemporaryDirectory(prefix="memdoc-hr-score-") as folder:
            trace = str(Path(folder) / "run.memdoc")
            memdoc_run = [sys.executable, "-m", "memdoc", "run", "-q", "-o", trace, "--"]
            status, out, _ = run_bounded([*memdoc_run, *argv], RUN_TIMEOUT_S)
    else:
        status, out, _ = run_bounded(argv, RUN_TIMEOUT_S)
    return status == 0 and out.rstrip().endswith("done")


def compare(program: Program) -> str:
    """Does the program fail under `memdoc run` where it fails plainly? One run of the truth
    and of the next multiple up, each way."""
    next_up = program.truth + program.multiple_of
    cells = [
        "yes" if trains(program.file, size, under_memdoc=memdoc) else "no"
        for memdoc in (False, True)
        for size in (program.truth, next_up)
    ]
    return f"| {program.name} | {program.truth} / {next_up} | {' / '.join(cells[:2])} | " + (
        f"{' / '.join(cells[2:])} |"
    )


def find_truth(file: str, multiple_of: int, start: int, runs: int) -> tuple[int, list[str]]:
    """The largest multiple of K that trains in every one of `runs` plain runs while the next
    multiple fails in every one: doubling up from `start` and bisecting on multiples with one
    run a size, then `runs` runs at the border, moving it down while the lower size fails
    once, up while the next size trains once."""
    log: list[str] = []

    def trained(size: int, count: int) -> int:
        done = sum(trains(file, size) for _ in range(count))
        log.append(f"size {size}: trained {done} of {count}")
        print(log[-1], flush=True)
        return done

    low, high = 0, start
    while trained(high, 1):
        low, high = high, 2 * high
    while high - low > multiple_of:
        middle = (low + high) // 2
        middle -= middle % multiple_of
        if middle <= low:
            break
        if trained(middle, 1):
            low = middle
        else:
            high = middle
    while low > 0:
        if trained(low, runs) < runs:
            low -= multiple_of
        elif trained(low + multiple_of, runs) > 0:
            low += multiple_of
        else:
            break
    return low, log


@dataclass
class Result:
    name: str
    split: str
    truth: int
    multiple_of: int
    answer: int | None = None
    at_least: bool = False
    measured: bool | None = None
    probes: int = 0
    verdict: str = "none"  # exact, one below, wrong, none
    answer_trains: bool | None = None
    next_fails: bool | None = None
    duration_s: float = 0.0
    problem: str = ""


def score(program: Program) -> Result:
    result = Result(program.name, program.split, program.truth, program.multiple_of)
    memdoc = [sys.executable, "-m", "memdoc", "headroom", "--json", "--margin", "0"]
    memdoc += ["--multiple-of", str(program.multiple_of), "--sizes", program.sizes, "--"]
    started = time.monotonic()
    status, out, err = run_bounded([*memdoc, *command(program.file, "{}")], HEADROOM_TIMEOUT_S)
    result.duration_s = round(time.monotonic() - started, 1)
    if status is None:
        result.problem = f"timed out after {HEADROOM_TIMEOUT_S} s"
        return result
    try:
        answer: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError:
        lines = err.strip().splitlines()
        result.problem = f"exit {status}: {lines[0] if lines else 'no output'}"
        return result
    result.answer = answer.get("largest_size")
    result.at_least = bool(answer.get("at_least", False))
    result.measured = answer.get("measured")
    result.probes = len(answer.get("probes", []))
    if result.answer is None:
        result.problem = "no answer"
        return result
    if result.answer == program.truth:
        result.verdict = "exact"
    elif result.answer == program.truth - program.multiple_of:
        result.verdict = "one below"
    else:
        result.verdict = "wrong"
    result.answer_trains = trains(program.file, result.answer)
    result.next_fails = not trains(program.file, result.answer + program.multiple_of)
    return result


def table(results: Sequence[Result]) -> list[str]:
    lines = [
        "| program | split | truth (K) | answer | verdict | answer trains | next fails "
        "| probes | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        answer = "-" if r.answer is None else f"{'at least ' if r.at_least else ''}{r.answer}"
        yes = {True: "yes", False: "NO", None: "-"}
        lines.append(
            f"| {r.name} | {r.split} | {r.truth} ({r.multiple_of}) | {answer} | "
            f"{r.verdict}{' (' + r.problem + ')' if r.problem else ''} | "
            f"{yes[r.answer_trains]} | {yes[r.next_fails]} | {r.probes} | {r.duration_s:.0f} s |"
        )
    exact = sum(r.verdict == "exact" for r in results)
    near = sum(r.verdict in ("exact", "one below") for r in results)
    lines.append(
        f"\nexact {exact} of {len(results)}; exact or one multiple below {near} of {len(results)}"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.headroom_score")
    parser.add_argument("--split", choices=(*SPLITS, "all"), default="dev")
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--find-truth",
        nargs=3,
        metavar=("FILE", "K", "START"),
        help="find a program's truth by plain runs (before memdoc runs on it)",
    )
    parser.add_argument("--runs", type=int, default=TRUTH_RUNS)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="run each truth and the next multiple up plainly and under memdoc run: does "
        "memdoc's agent move the border?",
    )
    args = parser.parse_args(argv)
    if args.find_truth:
        file, multiple_of, start = args.find_truth
        truth, _ = find_truth(file, int(multiple_of), int(start), args.runs)
        print(f"truth: {truth}")
        return 0
    programs = [
        p
        for p in load_programs()
        if (args.split in ("all", p.split)) and (not args.only or p.name in args.only)
    ]
    if args.compare:
        print("| program | truth / next | trains plainly | trains under memdoc run |")
        print("|---|---|---|---|")
        for program in programs:
            print(compare(program), flush=True)
        return 0
    results = []
    for program in programs:
        results.append(score(program))
        print(table(results[-1:])[-2], flush=True)
    print("\n".join(table(results)))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
