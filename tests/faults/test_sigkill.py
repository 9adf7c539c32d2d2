"""SIGKILL at random instants, of the program or of memdoc: the trace opens, samples kept."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from memdoc.errors import TraceError
from memdoc.trace import Metric, Trace, load_trace
from tests.conftest import memdoc_cmd

TRIALS = 30
PARALLEL = 3
# A short program that would run for 10 s: every kill lands while it runs.
PROGRAM = (
    "import time\n"
    "blocks = []\n"
    "for i in range(200):\n"
    "    blocks.append(bytearray(256 * 1024))\n"
    "    print('tick', i, flush=True)\n"
    "    time.sleep(0.05)\n"
)
# memdoc flushes at least every 0.5 s: a kill may lose that much, never a whole second.
KEPT_S = 1.0
# Samples older than KEPT_S can only be asked for once sampling had time to begin.
STARTUP_S = 0.5


@dataclass
class Trial:
    seed: int
    delay_s: float
    kill_unix: float
    trace: Trace | None
    exit_status: int | None
    problem: str | None = None


def _start(folder: Path) -> subprocess.Popen[bytes]:
    (folder / "prog.py").write_text(PROGRAM)
    return subprocess.Popen(
        memdoc_cmd("run", "-q", "-o", "t.memdoc", "prog.py"),
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so that nothing outlives the trial
        env={k: v for k, v in os.environ.items() if k != "MEMDOC_AGENT"},
    )


def _stop_group(memdoc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(memdoc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        memdoc.communicate(timeout=10)


def _wait_for_child(memdoc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    parent = psutil.Process(memdoc.pid)
    while time.monotonic() < deadline:
        # The program, not the stderr copier memdoc may start before it.
        for child in parent.children():
            with contextlib.suppress(psutil.Error):
                if child.cmdline()[1:] == ["prog.py"]:
                    return int(child.pid)
        time.sleep(0.01)
    raise AssertionError("memdoc never started the program")


def _load(path: Path) -> Trace | str:
    try:
        return load_trace(path)
    except TraceError as exc:
        return f"the trace does not open: {exc.message}"


def _last_sample_unix(trace: Trace) -> float | None:
    series = trace.series(Metric.HOST_RSS)
    last = series.last() if series is not None else None
    return trace.header.created_unix + last[0] if last is not None else None


def _samples_kept(trace: Trace, kill_unix: float) -> str | None:
    """None when every sample older than KEPT_S before the kill is in the trace."""
    if kill_unix - trace.header.created_unix < KEPT_S + STARTUP_S:
        return None
    last = _last_sample_unix(trace)
    if last is None:
        return "no host sample at all"
    if last < kill_unix - KEPT_S:
        return f"the last sample is {kill_unix - last:.2f} s older than the kill"
    return None


def kill_program_trial(seed: int, folder: Path) -> Trial:
    delay_s = random.Random(seed).uniform(0.0, 3.0)
    memdoc = _start(folder)
    try:
        child = _wait_for_child(memdoc)
        time.sleep(delay_s)
        kill_unix = time.time()
        os.kill(child, signal.SIGKILL)
        memdoc.communicate(timeout=60)
    finally:
        _stop_group(memdoc)
    loaded = _load(folder / "t.memdoc")
    trial = Trial(seed, delay_s, kill_unix, None, memdoc.returncode)
    if isinstance(loaded, str):
        trial.problem = loaded
        return trial
    trial.trace = loaded
    if memdoc.returncode != -signal.SIGKILL:  # memdoc dies of its program's signal
        trial.problem = f"memdoc exited {memdoc.returncode}, not by SIGKILL"
    elif loaded.exit is None or loaded.exit.signal != signal.SIGKILL:
        trial.problem = f"the trace ends with {loaded.exit}, not the SIGKILL"
    else:
        trial.problem = _samples_kept(loaded, kill_unix)
    return trial


def _wait_for_trace(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.005)


def kill_memdoc_trial(seed: int, folder: Path) -> Trial:
    rng = random.Random(seed)
    # A third of the kills land anywhere in memdoc's start; the rest while it records.
    early = seed % 3 == 0
    delay_s = rng.uniform(0.0, 1.0) if early else rng.uniform(0.0, 3.0)
    memdoc = _start(folder)
    try:
        if not early:
            _wait_for_trace(folder / "t.memdoc")
        time.sleep(delay_s)
        kill_unix = time.time()
        memdoc.kill()
        memdoc.wait(timeout=10)
    finally:
        _stop_group(memdoc)  # the orphaned program runs on; stop it too
    trial = Trial(seed, delay_s, kill_unix, None, memdoc.returncode)
    path = folder / "t.memdoc"
    if not path.exists():
        return trial  # killed before it began a trace: nothing to open
    loaded = _load(path)
    if isinstance(loaded, str):
        trial.problem = loaded
        return trial
    trial.trace = loaded
    if loaded.complete:
        trial.problem = "a trace of a killed memdoc claims to be complete"
    else:
        trial.problem = _samples_kept(loaded, kill_unix)
    return trial


def _run_trials(tmp_path: Path, trial: Callable[[int, Path], Trial]) -> list[Trial]:
    folders = [tmp_path / f"seed-{seed}" for seed in range(TRIALS)]
    for folder in folders:
        folder.mkdir()
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(trial, range(TRIALS), folders))


def _problems(trials: list[Trial]) -> list[str]:
    return [
        f"seed {t.seed} (kill after {t.delay_s:.2f} s): {t.problem}" for t in trials if t.problem
    ]


@pytest.mark.slow
def test_sigkill_of_the_program_at_any_instant_leaves_a_complete_trace_that_names_the_kill(
    tmp_path: Path,
) -> None:
    trials = _run_trials(tmp_path, kill_program_trial)

    assert _problems(trials) == []
    # The property was checked, not skipped: most kills came late enough to ask for samples.
    checked = [
        t
        for t in trials
        if t.trace and t.kill_unix - t.trace.header.created_unix >= KEPT_S + STARTUP_S
    ]
    assert len(checked) >= TRIALS // 3


@pytest.mark.slow
def test_sigkill_of_memdoc_at_any_instant_leaves_a_trace_that_opens_with_every_older_sample(
    tmp_path: Path,
) -> None:
    trials = _run_trials(tmp_path, kill_memdoc_trial)

    assert _problems(trials) == []
    with_trace = [t for t in trials if t.trace is not None]
    assert len(with_trace) >= 2 * TRIALS // 3, "the late kills land after the trace began"
    checked = [
        t
        for t in with_trace
        if t.trace is not None and t.kill_unix - t.trace.header.created_unix >= KEPT_S + STARTUP_S
    ]
    assert len(checked) >= TRIALS // 4
