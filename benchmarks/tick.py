"""What one sampling tick costs: each in-process collector, the whole Session.tick, the parent's."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import Context, Figure, Target, percentiles, summarise, unavailable
from memdoc.collectors.base import Collector
from memdoc.session import DEFAULT_INTERVAL_S, Session
from memdoc.trace import SCHEMA_VERSION, CollectorStatus, Header, TraceWriter

TICK_TARGET = Target(50.0, "≤ 50 µs")
# A family for the parent to watch: a root with two children, all idle.
_FAMILY = (
    "import subprocess, sys, time\n"
    "sleeper = [sys.executable, '-c', 'import time; time.sleep(120)']\n"
    "kids = [subprocess.Popen(sleeper) for _ in range(2)]\n"
    "time.sleep(120)\n"
)


class _Recorder(TraceWriter):
    """A real trace writer that also remembers the collector records it was given."""

    statuses: list[CollectorStatus]

    def collector(self, status: CollectorStatus) -> None:
        self.statuses.append(status)
        super().collector(status)


def _writer(path: Path) -> _Recorder:
    header = Header(version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="bench")
    writer = _Recorder(path, header, force=True)
    writer.statuses = []
    return writer


def sample_cost_us(collector: Collector, ticks: int, interval_s: float) -> list[float]:
    """Per-call cost of `sample`, with the tick clock advancing as the session's would, so
    a collector's slower inner cadences (process tree, system memory) count in proportion."""
    start = time.time()
    costs = []
    for i in range(ticks):
        t0 = time.perf_counter_ns()
        collector.sample(start + i * interval_s)
        costs.append((time.perf_counter_ns() - t0) / 1000)
    return costs


def tick_cost_us(tick: Callable[[], None], ticks: int, interval_s: float) -> list[float]:
    """Per-call cost of a whole tick, called at the real interval (sleeping between)."""
    costs = []
    for _ in range(ticks):
        t0 = time.perf_counter_ns()
        tick()
        costs.append((time.perf_counter_ns() - t0) / 1000)
        time.sleep(interval_s)
    return costs


def _figure(key: str, title: str, costs: list[float], target: Target | None = None) -> Figure:
    # The mean is what a tick costs on average (inner cadences included); the median and
    # p99 say how it is spread.
    mean = sum(costs) / len(costs)
    median, p99 = percentiles(costs, 0.5, 0.99)
    figure = summarise(
        key, title, [mean], "µs", target=target, note=f"median {median:.1f}, p99 {p99:.1f}"
    )
    figure.repeats = len(costs)
    figure.spread = (min(costs), max(costs))
    return figure


def tick_group(ctx: Context) -> list[Figure]:
    ticks = ctx.pick(2000, 20000)
    figures = [_host(ctx, ticks), _nvml(ctx), _torch(ctx, ticks)]
    figures += _session_ticks(ctx)
    figures.append(_parent(ctx))
    return figures


def _host(ctx: Context, ticks: int) -> Figure:
    from memdoc.collectors.host import HostCollector

    session = Session(_writer(ctx.workdir / "tick-host.memdoc"))
    collector = HostCollector(os.getpid(), include_children=True)
    if not session.add_collector(collector):
        return unavailable("tick.host", "host collector", "µs", "the host collector did not start")
    return _figure(
        "tick.host",
        "host collector (this process)",
        sample_cost_us(collector, ticks, DEFAULT_INTERVAL_S),
    )


def _nvml(ctx: Context) -> Figure:
    from memdoc.collectors.nvml import NvmlCollector

    status = NvmlCollector(root_pid=os.getpid()).probe()
    if not status.available:
        return unavailable(
            "tick.nvml", "NVML collector", "µs", f"unavailable here: {status.reason}"
        )
    writer = _writer(ctx.workdir / "tick-nvml.memdoc")
    session = Session(writer)
    collector = NvmlCollector(root_pid=os.getpid())
    if not session.add_collector(collector):
        return unavailable("tick.nvml", "NVML collector", "µs", "NVML did not start")
    return _figure(
        "tick.nvml", "NVML collector", sample_cost_us(collector, 200, DEFAULT_INTERVAL_S)
    )


def _torch(ctx: Context, ticks: int) -> Figure:
    import torch

    from memdoc.collectors.frameworks import framework_collectors

    model = torch.nn.Linear(256, 256)
    _ = model(torch.randn(32, 256)).sum()
    writer = _writer(ctx.workdir / "tick-torch.memdoc")
    session = Session(writer)
    lazy = next(c for c in framework_collectors() if c.name == "pytorch")
    session.add_collector(lazy)
    lazy.sample(time.time())  # activates on the first tick once torch is imported
    failed = [s for s in writer.statuses if s.name == "pytorch" and not s.available]
    if failed or "pytorch" not in session.active_collectors():
        reason = failed[-1].reason if failed else "it did not start"
        return unavailable(
            "tick.torch", "PyTorch collector (CPU)", "µs", f"not available yet: {reason}"
        )
    return _figure(
        "tick.torch", "PyTorch collector (CPU)", sample_cost_us(lazy, ticks, DEFAULT_INTERVAL_S)
    )


def _session_ticks(ctx: Context) -> list[Figure]:
    from memdoc.collectors.registry import agent_collectors, in_process_collectors

    ticks = ctx.pick(30, 150)
    floor = statistics.median(tick_cost_us(_nothing, ticks, DEFAULT_INTERVAL_S))
    figures = []
    for key, title, collectors in (
        ("tick.agent", "Session.tick in a `memdoc run` agent (frameworks)", agent_collectors()),
        (
            "tick.watch",
            "Session.tick under memdoc.watch (host, NVML, frameworks)",
            in_process_collectors(),
        ),
    ):
        session = Session(_writer(ctx.workdir / f"{key}.memdoc"))
        for collector in collectors:
            session.add_collector(collector)
        running = ", ".join(session.active_collectors())
        ctx.log(f"{key}: {ticks} ticks at {DEFAULT_INTERVAL_S} s ({running})")
        costs = tick_cost_us(session.tick, ticks, DEFAULT_INTERVAL_S)
        hot = statistics.median(tick_cost_us(session.tick, 200, 0.0))
        figure = _figure(key, title, costs, TICK_TARGET)
        # After a sleep, caches are cold: an empty call then costs the machine's floor.
        figure.note += f"; back to back {hot:.1f}; an empty call after the same sleep {floor:.1f}"
        figures.append(figure)
    return figures


def _nothing() -> None:
    return None


def _parent(ctx: Context) -> Figure:
    from memdoc.collectors.registry import parent_collectors

    family = subprocess.Popen([sys.executable, "-c", _FAMILY])
    try:
        time.sleep(1.0)  # let the children start, so the tree has three processes
        session = Session(_writer(ctx.workdir / "tick-parent.memdoc"))
        for collector in parent_collectors(family.pid):
            session.add_collector(collector)
        ticks = ctx.pick(30, 150)
        ctx.log(f"parent tick: {ticks} ticks, a tree of 3 processes")
        costs = tick_cost_us(session.tick, ticks, DEFAULT_INTERVAL_S)
    finally:
        _kill_tree(family)
    return _figure("tick.parent", "parent Session.tick (host tree of 3 + NVML)", costs)


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    import psutil

    with_children = [process.pid] + [
        c.pid for c in psutil.Process(process.pid).children(recursive=True)
    ]
    for pid in with_children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    process.wait()
