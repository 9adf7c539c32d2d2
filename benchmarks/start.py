"""How long memdoc takes to start: `memdoc --version`, `memdoc --help`, and what `memdoc run`
adds to a program that does nothing (start, agent, trace and end-of-run summary)."""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import (
    Context,
    Figure,
    Target,
    child_env,
    last_line,
    summarise,
    unavailable,
)

START_TARGET = Target(0.15, "≤ 0.15 s")
RUN_ADDED_TARGET = Target(0.3, "≤ 0.3 s")
TRIVIAL = 'print("hello")\n'


@dataclass(frozen=True)
class Command:
    name: str
    argv: tuple[str, ...]


def memdoc_entry() -> list[str]:
    """The `memdoc` console script beside this interpreter (what a user types), else
    `python -m memdoc`."""
    script = Path(sys.executable).with_name("memdoc")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("memdoc")
    return [found] if found else [sys.executable, "-m", "memdoc"]


def start_env(pycache: Path | None) -> dict[str, str]:
    """The measured commands' environment. With `pycache`, bytecode is cached there as an
    installed package's is (pip compiles it at install), even where the environment says
    not to write bytecode; without it, whatever this environment does."""
    env = child_env()
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def start_group(ctx: Context) -> list[Figure]:
    folder = ctx.workdir / "start"
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "hello.py"
    program.write_text(TRIVIAL)
    trace = folder / "hello.memdoc"
    memdoc = memdoc_entry()
    commands = (
        Command("python", (sys.executable, str(program))),
        Command("version", (*memdoc, "--version")),
        Command("help", (*memdoc, "--help")),
        Command("run", (*memdoc, "run", "--force", "-o", str(trace), str(program))),
    )
    env = start_env(folder / "pycache")
    rounds = ctx.pick(5, 15)
    times: dict[str, list[float]] = {c.name: [] for c in commands}
    log = folder / "output.log"
    for command in commands:  # a first run of each fills the bytecode cache
        failure = _timed(command, folder, env, log)
        if isinstance(failure, str):
            return [unavailable("start.run", "memdoc start", "s", failure)]
    order = list(commands)
    shuffle = random.Random(ctx.seed)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for command in order:
            seconds = _timed(command, folder, env, log)
            if isinstance(seconds, str):
                return [unavailable("start.run", "memdoc start", "s", seconds)]
            times[command.name].append(seconds)
    return _figures(times)


def _timed(command: Command, folder: Path, env: dict[str, str], log: Path) -> float | str:
    """Wall seconds of one run, its output to a file (as a batch job's is: memdoc then reads
    the program's stderr back from the file, as it would keep a pipe's); or why it failed."""
    with log.open("wb") as out:
        start = time.perf_counter()
        child = subprocess.Popen(command.argv, cwd=folder, env=env, stdout=out, stderr=out)
        # Waited for without a timeout: `Popen.wait(timeout)` polls with sleeps of up to 50
        # ms, which rounded every time measured here up to the next poll. A timer ends a
        # run that hangs instead.
        watchdog = threading.Timer(120.0, child.kill)
        watchdog.start()
        try:
            returncode = child.wait()
        finally:
            watchdog.cancel()
        seconds = time.perf_counter() - start
    if returncode != 0:
        return f"{command.name} failed (exit {returncode}): {last_line(log.read_bytes())}"
    return seconds


def _figures(times: dict[str, list[float]]) -> list[Figure]:
    python = times["python"]
    # Paired: each round's run against the plain run of the same round.
    added = [run - plain for run, plain in zip(times["run"], python, strict=True)]
    floor = f"python alone: median {statistics.median(python):.3f} s, best {min(python):.3f} s"
    return [
        summarise(
            "start.version",
            "memdoc --version",
            times["version"],
            "s",
            target=START_TARGET,
            note=f"best {min(times['version']):.3f} s; {floor}",
        ),
        summarise(
            "start.help",
            "memdoc --help",
            times["help"],
            "s",
            target=START_TARGET,
            note=f"best {min(times['help']):.3f} s",
        ),
        summarise(
            "start.run_added",
            "memdoc run: time added to a program that does nothing",
            added,
            "s",
            target=RUN_ADDED_TARGET,
            note=(
                f"memdoc run {statistics.median(times['run']):.3f} s against python "
                f"{statistics.median(python):.3f} s (medians); best against best "
                f"{min(times['run']) - min(python):.3f} s; start, agent, trace and summary, "
                "output to a file"
            ),
        ),
    ]
