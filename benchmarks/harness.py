"""Figures, targets and the statistics every group shares: medians and spreads of repeats."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCHMARKS_DIR.parent


@dataclass(frozen=True)
class Target:
    """An upper bound a figure must stay under (every memdoc target is one)."""

    limit: float
    text: str

    def met_by(self, value: float) -> bool:
        return value <= self.limit


@dataclass
class Figure:
    """One measured number: the median of its repeats, their range, and what it should be."""

    key: str
    title: str
    value: float | None
    unit: str
    spread: tuple[float, float] | None = None
    repeats: int = 1
    target: Target | None = None
    note: str = ""

    @property
    def status(self) -> str:
        if self.value is None:
            return "n/a"
        if self.target is None:
            return "-"
        return "ok" if self.target.met_by(self.value) else "OVER"


def unavailable(
    key: str, title: str, unit: str, reason: str, target: Target | None = None
) -> Figure:
    """A figure that cannot be measured here, saying why instead of inventing a number."""
    return Figure(key, title, None, unit, target=target, note=reason)


def summarise(
    key: str,
    title: str,
    samples: Sequence[float],
    unit: str,
    *,
    target: Target | None = None,
    note: str = "",
) -> Figure:
    """The median of `samples` with their min..max range as the spread."""
    if not samples:
        return unavailable(key, title, unit, note or "no samples", target)
    spread = (min(samples), max(samples)) if len(samples) > 1 else None
    return Figure(
        key,
        title,
        statistics.median(samples),
        unit,
        spread=spread,
        repeats=len(samples),
        target=target,
        note=note,
    )


@dataclass
class Context:
    """What a group gets: the mode, a scratch folder, a progress line, shared artefacts."""

    quick: bool
    workdir: Path
    seed: int = 20240601
    shared: dict[str, object] = field(default_factory=dict)

    def log(self, message: str) -> None:
        print(f"  .. {message}", file=sys.stderr, flush=True)

    def pick(self, quick: T, full: T) -> T:
        """The quick run's value or the full run's."""
        return quick if self.quick else full


Group = Callable[[Context], list[Figure]]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for measured programs: no memdoc agent inherited, one torch thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC_")}
    env.setdefault("PYTHONHASHSEED", "0")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_timed(
    cmd: Sequence[str], *, cwd: Path, timeout_s: float, env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    """Run a command to its end; (wall seconds, the finished process)."""
    start = time.perf_counter()
    done = subprocess.run(
        list(cmd),
        cwd=cwd,
        env=env if env is not None else child_env(),
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    return time.perf_counter() - start, done


def last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def memdoc_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "memdoc", *args]


def percentiles(samples: Sequence[float], *quantiles: float) -> list[float]:
    """Nearest-rank percentiles of `samples` (0 < q < 1)."""
    ordered = sorted(samples)
    if not ordered:
        return [float("nan") for _ in quantiles]
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in quantiles]
