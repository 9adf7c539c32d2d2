"""A headroom probe runs until its peak stops rising: past the steps asked for while memory
still grows, never inside an evaluation, and never past its caps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from memdoc.run.agent import ENV_MAX_STEPS, ENV_SETTLE_S, ENV_SETTLE_STEPS, ENV_STOP_AFTER_STEPS
from memdoc.run.settle import SettleRule
from memdoc.trace import load_trace
from memdoc.trace.model import EventKind

MiB = float(1 << 20)


def rule(min_steps: int = 3, quiet: int = 3, max_steps: int = 50, max_s: float = 300) -> SettleRule:
    return SettleRule(min_steps, quiet, max_steps, max_s)


def first_stop(
    settle: SettleRule, peaks: list[float], *, evaluating: frozenset[int] = frozenset()
) -> int:
    for step, peak in enumerate(peaks, start=1):
        settle.observe(step, float(step), {"address_space_peak_bytes": peak})
        if settle.done(step, float(step), evaluating=step in evaluating):
            return step
    raise AssertionError("never stopped")


def test_a_flat_peak_ends_after_the_steps_asked_for() -> None:
    settle = rule(min_steps=5)
    assert first_stop(settle, [500 * MiB] * 20) == 5
    assert settle.settled


def test_a_peak_still_rising_keeps_the_probe_running() -> None:
    # GIVEN a peak that rises until step 10 (optimizer state, a first evaluation)
    peaks = [500 * MiB + 20 * MiB * min(step, 10) for step in range(1, 30)]
    # THEN the probe runs three quiet steps past the last rise
    assert first_stop(rule(min_steps=5), peaks) == 13


def test_an_evaluation_after_the_steps_asked_for_raises_the_peak_and_is_waited_for() -> None:
    # An evaluation between steps 6 and 7: the step after it reads the high-water mark.
    peaks = [500 * MiB] * 6 + [700 * MiB] * 20
    assert first_stop(rule(min_steps=8), peaks) == 10


def test_small_creep_is_not_a_rise() -> None:
    peaks = [1000 * MiB + 0.1 * MiB * step for step in range(1, 30)]
    assert first_stop(rule(min_steps=5), peaks) == 5


def test_no_probe_ends_inside_an_evaluation() -> None:
    assert first_stop(rule(min_steps=5), [500 * MiB] * 20, evaluating=frozenset({5, 6})) == 7


def test_a_peak_that_never_settles_ends_at_the_step_cap() -> None:
    settle = rule(min_steps=5, max_steps=12)
    assert first_stop(settle, [100 * MiB * step for step in range(1, 30)]) == 12
    assert settle.why == "step cap" and not settle.settled


def test_a_slow_probe_ends_at_the_time_cap() -> None:
    settle = rule(min_steps=2, max_s=4.0)  # one second a step in first_stop
    assert first_stop(settle, [100 * MiB * step for step in range(1, 30)]) == 5
    assert settle.why == "time cap"


# Holds 8 MiB more (touched) at each of its first RISING steps, then stays flat.
GROWS_THEN_FLAT = """
import sys
import memdoc
rising = int(sys.argv[1])
kept = []
for step in range(1, 60):
    if step <= rising:
        kept.append(bytearray(8 << 20))
    print("step", step, flush=True)
    memdoc.step()
"""


def test_a_real_probe_runs_until_its_memory_stops_rising(tmp_path: Path) -> None:
    program = tmp_path / "grows.py"
    program.write_text(GROWS_THEN_FLAT)
    trace_path = tmp_path / "probe.memdoc"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    env.update(
        {
            ENV_STOP_AFTER_STEPS: "3",
            ENV_SETTLE_STEPS: "3",
            ENV_MAX_STEPS: "40",
            ENV_SETTLE_S: "60",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "memdoc", "run", "-q", "--force", "-o", str(trace_path)]
        + [str(program), "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    trace = load_trace(trace_path)
    (stop,) = trace.events(EventKind.STOP)
    assert stop.data["settled"] is True
    assert stop.data["last_rise_step"] == 10
    assert stop.data["after_steps"] == 13 == len(trace.steps())


def test_without_a_settle_rule_the_probe_ends_at_the_steps_asked_for(tmp_path: Path) -> None:
    program = tmp_path / "grows.py"
    program.write_text(GROWS_THEN_FLAT)
    trace_path = tmp_path / "probe.memdoc"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    env[ENV_STOP_AFTER_STEPS] = "3"
    done = subprocess.run(
        [sys.executable, "-m", "memdoc", "run", "-q", "--force", "-o", str(trace_path)]
        + [str(program), "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    assert len(load_trace(trace_path).steps()) == 3


# Holds SIZE MiB in each of 12 steps and evaluates after steps 6 and 12 on three times as
# much, under an address-space cap of 512 MiB more than it maps at the start: a probe of five
# steps never sees the evaluation, and answers sizes that fail in it.
LATE_EVALUATION = """
import resource, sys
size = int(sys.argv[1])
try:
    from memdoc import step
except ImportError:
    def step():
        pass
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (512 << 20), resource.RLIM_INFINITY))
for number in range(1, 13):
    batch = bytearray(size << 20)
    del batch
    step()
    if number % 6 == 0:
        scores = bytearray(3 * size << 20)
        del scores
print("done")
"""


def plain_trains(program: Path, size: int) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    done = subprocess.run(
        [sys.executable, str(program), str(size)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0 and done.stdout.strip() == "done"


def test_headroom_answers_a_size_that_survives_an_evaluation_after_step_five(
    tmp_path: Path,
) -> None:
    program = tmp_path / "train.py"
    program.write_text(LATE_EVALUATION)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    done = subprocess.run(
        [sys.executable, "-m", "memdoc", "headroom", "--margin", "0", "--multiple-of", "16"]
        + ["--json", "--", sys.executable, str(program), "{}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    answer = json.loads(done.stdout)
    size, too_big = answer["largest_size"], answer["too_big"]
    assert too_big == size + 16, answer
    assert all(p["steps"] >= 8 for p in answer["probes"] if not p["oom"])
    assert plain_trains(program, size)
    assert not plain_trains(program, too_big)
