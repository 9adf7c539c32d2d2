"""`python -m benchmarks.forecast`: OOM forecasts and headroom answers against the truth.

Each program runs under a memory cap (RLIMIT_AS) on the CPU:
- the leaking ones run under `memdoc run` until they really run out; the forecast that the
  trace supported at 30% of their steps is compared with the step that ran out, and with
  the step that runs out in plain runs of the program (no memdoc; the median of three);
- the batch ones get a `memdoc headroom` answer, and the truth is found by running sizes
  (multiples of K) under `memdoc run` until one runs out.

Prints a table; slow (minutes per program on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memdoc.forecast import forecast
from memdoc.run.headroom import find_headroom
from memdoc.trace import load_trace

PROGRAMS = Path(__file__).resolve().parent.parent / "tests" / "forecast" / "programs"
SHARE = 0.3


@dataclass(frozen=True)
class LeakCase:
    name: str
    program: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class BatchCase:
    name: str
    program: str
    sizes: tuple[int, ...]
    multiple_of: int
    args: tuple[str, ...]  # after the size


LEAKS = (
    LeakCase("PyTorch MLP, 3 MiB kept per step", "torch_leak.py", ("3", "400", "0.04")),
    LeakCase("PyTorch conv net, feature maps kept", "torch_conv.py", ("32", "300", "100000", "1")),
    LeakCase("JAX jit step, 8 MiB kept per step", "jax_leak.py", ("8", "1200", "0.03")),
    LeakCase("JAX jit step, 3 MiB kept per step", "jax_leak.py", ("3", "600", "0.04")),
    LeakCase(
        "JAX jit step, 3 MiB kept, one malloc arena",
        "jax_leak.py",
        ("3", "600", "0.04", "steady"),
    ),
    LeakCase("TensorFlow/Keras, BFC allocator limit", "tf_leak.py", ("2", "400")),
)
BATCHES = (
    BatchCase("PyTorch MLP over sequences", "torch_batch.py", (64, 128, 256), 64, ("320", "10")),
    BatchCase("PyTorch conv net", "torch_conv.py", (16, 32, 64), 32, ("150", "6")),
    BatchCase(
        "PyTorch transformer layer + Adam", "torch_attention.py", (16, 32, 64), 16, ("500", "6")
    ),
    BatchCase("JAX jit step", "jax_batch.py", (64, 128, 256), 64, ("250", "10")),
    BatchCase(
        "TensorFlow/Keras, BFC allocator limit", "tf_batch.py", (64, 128, 256), 64, ("300", "6")
    ),
)


# For the batch programs: glibc reads these at start, before any thread (one arena, large
# blocks mapped on their own), so address space follows live memory from the first instant.
STEADY_MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def memdoc_run(
    trace: Path, program: str, args: Sequence[str], *, steady: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    if steady:
        env.update(STEADY_MALLOC_ENV)
    command = [sys.executable, "-m", "memdoc", "run", "-q", "--force", "-o", str(trace), "--"]
    command += [sys.executable, str(PROGRAMS / program), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


PLAIN_RUNS = 3


def plain_oom_step(case: LeakCase) -> int | None:
    """The step that runs out without memdoc (one past the last "step N" printed), the
    median of PLAIN_RUNS runs; None when a run did not run out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    found = []
    for _ in range(PLAIN_RUNS):
        done = subprocess.run(
            [sys.executable, str(PROGRAMS / case.program), *case.args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            return None
        steps = [line for line in done.stdout.splitlines() if line.startswith("step ")]
        found.append(len(steps) + 1)
    return sorted(found)[len(found) // 2]


def leak_row(case: LeakCase, folder: Path) -> str:
    trace_path = folder / f"{case.program}-{len(case.args)}.memdoc"
    started = time.monotonic()
    memdoc_run(trace_path, case.program, case.args)
    trace = load_trace(trace_path)
    steps = trace.steps()
    truth = len(steps) + 1
    if trace.ending_oom() is None or not steps:
        return f"| {case.name} | did not run out ({len(steps)} steps) | | | |"
    cut = steps[max(0, round(SHARE * len(steps)) - 1)]
    said = forecast(trace, until_s=cut.t)
    if said is None:
        return f"| {case.name} | {truth} | no forecast at step {cut.data.get('step')} | | |"
    error = (said.oom_step - truth) / truth
    plain = plain_oom_step(case)
    against_plain = f"{plain} | {(said.oom_step - plain) / plain:+.1%}" if plain else "- | -"
    return (
        f"| {case.name} | {truth} | {said.oom_step} ({said.oom_step_early}–{said.oom_step_late}) "
        f"at step {said.step} | {error:+.1%} | {against_plain} | "
        f"{time.monotonic() - started:.0f} s |"
    )


def fits(case: BatchCase, size: int, folder: Path) -> bool:
    done = memdoc_run(
        folder / f"truth-{size}.memdoc", case.program, (str(size), *case.args), steady=True
    )
    return done.returncode == 0


def batch_row(case: BatchCase, folder: Path) -> str:
    started = time.monotonic()
    template = [sys.executable, str(PROGRAMS / case.program), "{}", *case.args]
    steps = 4
    saved = dict(os.environ)
    os.environ.update(STEADY_MALLOC_ENV)  # the probes inherit it
    try:
        result = find_headroom(
            template,
            case.sizes,
            steps=steps,
            margin=0.0,
            multiple_of=case.multiple_of,
            workdir=folder,
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    answer = result.largest_size
    if answer is None:
        return f"| {case.name} | | nothing fits | | |"
    # The truth: walk multiples of K from the answer until the first that runs out.
    size = answer
    if fits(case, size, folder):
        while fits(case, size + case.multiple_of, folder):
            size += case.multiple_of
        truth = size
    else:
        size -= case.multiple_of
        while size > 0 and not fits(case, size, folder):
            size -= case.multiple_of
        truth = size
    probes = len(result.probes)
    dominant = result.fit.dominant if result.fit is not None else "no fit"
    return (
        f"| {case.name} | {truth} | {answer} ({'measured' if result.measured else 'extrapolated'}, "
        f"{probes} probes, {dominant} dominates) | {(answer - truth) / truth:+.1%} | "
        f"{time.monotonic() - started:.0f} s |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forecast", description=__doc__)
    parser.add_argument("--only", choices=("forecast", "headroom"), help="one half only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memdoc-forecast-bench-") as tmp:
        folder = Path(tmp)
        if args.only in (None, "forecast"):
            print(
                "| leaking program | OOM step under memdoc | forecast at 30% of the steps | error "
                "| OOM step plainly (median of 3) | error against it | time |"
            )
            print("|---|---|---|---|---|---|---|")
            for leak in LEAKS:
                print(leak_row(leak, folder), flush=True)
        if args.only in (None, "headroom"):
            print()
            print("| batch program | largest size that trains | headroom answer | error | time |")
            print("|---|---|---|---|---|")
            for batch in BATCHES:
                print(batch_row(batch, folder), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
