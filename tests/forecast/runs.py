"""Run the test programs under `memdoc run` and read what really happened."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from memdoc.forecast import Forecast, forecast
from memdoc.trace import Trace, load_trace

PROGRAMS = Path(__file__).resolve().parent / "programs"
# glibc read from the environment at start, before any thread: one arena, and large blocks
# mapped on their own, so that address space follows live memory from the first instant
# (see programs/host_cap.py); a program's own mallopt comes after its imports' threads.
STEADY_MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


@dataclass(frozen=True)
class LeakRun:
    trace: Trace
    stderr: str
    oom_step: int  # the step that ran out: one past the last step completed

    def forecast_at(self, share: float) -> Forecast | None:
        """The forecast that the trace supported once `share` of the steps had run."""
        steps = self.trace.steps()
        cut = steps[max(0, round(share * len(steps)) - 1)]
        return forecast(self.trace, until_s=cut.t)


def memdoc_run(
    tmp_path: Path,
    program: str,
    *args: str,
    env: dict[str, str] | None = None,
    options: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`memdoc run [options] program args`, its trace named after the program."""
    trace = tmp_path / f"{Path(program).stem}.memdoc"
    full_env = {k: v for k, v in os.environ.items() if k != "MEMDOC_AGENT"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "memdoc", "run", "--force", "-o", str(trace), *options]
        + [str(PROGRAMS / program), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def leak_run(tmp_path: Path, program: str, *args: str) -> LeakRun:
    done = memdoc_run(tmp_path, program, *args)
    trace = load_trace(tmp_path / f"{Path(program).stem}.memdoc")
    assert trace.ending_oom() is not None, done.stderr[-2000:]
    return LeakRun(trace, done.stderr, len(trace.steps()) + 1)


def plain_run(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The program alone, as the truth: no memdoc in the way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    return subprocess.run(
        [sys.executable, str(PROGRAMS / program), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
