"""The trace on disk: bytes per value, write throughput, the time to load a million values, and
the memory that reading keeps per step event."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks.harness import REPO_DIR, Context, Figure, Target, last_line, run_timed, summarise
from benchmarks.synthetic import CREATED_UNIX, million_value_trace, rank_pid
from memdoc.trace import SCHEMA_VERSION, Event, EventKind, ExitInfo, Header, TraceWriter, load_trace

# Reading in a process of its own: the resident memory it added (the peak, counted from after
# the imports) and its seconds.
_LOAD_STEPS = """
import sys, time
from memdoc.trace import load_trace
def kib(field):
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith(field)))
before = kib("VmRSS:")
try:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak counts from here
except OSError:
    pass
start = time.perf_counter()
trace = load_trace(sys.argv[1])
seconds = time.perf_counter() - start
print(len(trace.steps()), (kib("VmHWM:") - before) * 1024, seconds)
"""


def trace_group(ctx: Context) -> list[Figure]:
    ctx.log("writing a one-million-value trace")
    path, values, write_s = million_value_trace(ctx.workdir, ctx.shared)
    size = path.stat().st_size
    loads = []
    for _ in range(ctx.pick(1, 3)):
        start = time.perf_counter()
        trace = load_trace(path)
        loads.append(time.perf_counter() - start)
        assert trace.values_read == values, "the trace did not read back whole"
    return [
        summarise(
            "trace.bytes_per_value",
            "bytes on disk per recorded value",
            [size / values],
            "B",
            target=Target(40.0, "≤ 40 B"),
            note=f"{values:,} values in {size / 1e6:.1f} MB, all records included",
        ),
        summarise(
            "trace.write_rate", "write throughput (TraceWriter)", [values / write_s], "values/s"
        ),
        summarise(
            "trace.load_1m",
            "load a one-million-value trace",
            loads,
            "s",
            target=Target(2.0, "< 2 s"),
        ),
        *_step_figures(ctx),
    ]


def _step_figures(ctx: Context) -> list[Figure]:
    steps = ctx.pick(100_000, 500_000)
    ctx.log(f"writing a trace of {steps:,} steps")
    path = _step_trace(ctx.workdir / f"steps-{steps}.memdoc", steps)
    line_bytes = path.stat().st_size / steps
    per_step: list[float] = []
    loads: list[float] = []
    for _ in range(ctx.pick(1, 3)):
        _, done = run_timed(
            [sys.executable, "-c", _LOAD_STEPS, str(path)], cwd=REPO_DIR, timeout_s=600
        )
        if done.returncode != 0:
            raise RuntimeError(f"reading the step trace failed: {last_line(done.stderr)}")
        read, added_bytes, seconds = done.stdout.split()
        assert int(read) == steps, "the step trace did not read back whole"
        per_step.append(int(added_bytes) / steps)
        loads.append(float(seconds))
    return [
        summarise(
            "trace.step_memory",
            "memory kept per step event read",
            per_step,
            "B",
            target=Target(100.0, "≤ 100 B"),
            note=f"{steps:,} steps of {line_bytes:.0f} B of text each; peak resident memory "
            "that load_trace added, over the steps",
        ),
        summarise("trace.load_steps", f"load a trace of {steps:,} steps", loads, "s"),
    ]


def _step_trace(path: Path, steps: int) -> Path:
    """A trace of optimizer steps and nothing else: what a long run of fast steps writes most."""
    header = Header(version=SCHEMA_VERSION, created_unix=CREATED_UNIX, memdoc_version="bench")
    writer = TraceWriter(path, header, force=True)
    pid = rank_pid(0)
    for number in range(1, steps + 1):
        t = CREATED_UNIX + number * 0.05
        # As memdoc writes a step: with the process's own memory at the boundary.
        own = {"host_rss_bytes": 900_000_000 + number * 4096, "host_anon_bytes": 600_000_000}
        data = {"step": number, "source": "optimizer", **own}
        writer.event(Event(t, EventKind.STEP, pid, data))
    writer.close(ExitInfo(CREATED_UNIX + steps * 0.05 + 1.0, exit_code=0))
    return path
