"""memdoc's own footprint in a long run at the fastest interval: the parent's RSS and CPU."""

from __future__ import annotations

import statistics
import subprocess
import time
from dataclasses import dataclass

import psutil

from benchmarks.harness import (
    BENCHMARKS_DIR,
    Context,
    Figure,
    Target,
    child_env,
    memdoc_cmd,
    summarise,
    unavailable,
)
from memdoc.trace import Metric, Trace, load_trace

MB = 1e6
POLL_S = 0.5


@dataclass(frozen=True)
class Reading:
    """The parent at one instant: wall clock, RSS, CPU seconds so far."""

    unix_t: float
    rss_mb: float
    cpu_s: float


def parent_rss_group(ctx: Context) -> list[Figure]:
    seconds = ctx.pick(10, 60)
    folder = ctx.workdir / "long-run"
    folder.mkdir(exist_ok=True)
    trace_path = folder / "long.memdoc"
    cmd = memdoc_cmd("run", "-q", "--interval", "0.01", "-o", str(trace_path))
    cmd += [str(BENCHMARKS_DIR / "workload.py"), "--seconds", str(seconds)]
    ctx.log(f"a {seconds} s training loop under memdoc run --interval 0.01")
    proc = subprocess.Popen(
        cmd, cwd=folder, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    readings = _watch(psutil.Process(proc.pid), proc)
    _, err = proc.communicate(timeout=120)
    if proc.returncode != 0 or len(readings) < 4:
        reason = (
            f"memdoc run failed (exit {proc.returncode}): {err.decode(errors='replace')[-200:]}"
        )
        return [unavailable("rss.parent.peak", "parent RSS", "MB", reason)]
    return _figures(readings, load_trace(trace_path), seconds)


def _watch(parent: psutil.Process, proc: subprocess.Popen[bytes]) -> list[Reading]:
    """The parent every POLL_S until it exits."""
    readings: list[Reading] = []
    while proc.poll() is None:
        try:
            with parent.oneshot():
                rss = parent.memory_info().rss / MB
                times = parent.cpu_times()
        except psutil.Error:
            break
        readings.append(Reading(time.time(), rss, times.user + times.system))
        time.sleep(POLL_S)
    return readings


def _figures(readings: list[Reading], trace: Trace, seconds: int) -> list[Figure]:
    rss = [r.rss_mb for r in readings]
    quarter = max(1, len(rss) // 4)
    growth = statistics.median(rss[-quarter:]) - statistics.median(rss[quarter : 2 * quarter])
    title = f"parent (memdoc run --interval 0.01, {seconds} s loop)"
    # CPU from the first quarter on, so that memdoc's own start-up is not counted.
    first, last = readings[quarter], readings[-1]
    cpu_s, wall_s = last.cpu_s - first.cpu_s, last.unix_t - first.unix_t
    series = trace.series(Metric.HOST_RSS)
    t0, t1 = (r.unix_t - trace.header.created_unix for r in (first, last))
    samples = len(series.window(t0, t1)[0]) if series is not None else 0
    figures = [
        summarise(
            "rss.parent.peak",
            f"{title}: peak RSS",
            [max(rss)],
            "MB",
            target=Target(150.0, "< 150 MB"),
        ),
        summarise(
            "rss.parent.growth",
            f"{title}: RSS growth, 2nd quarter to last",
            [growth],
            "MB",
            target=Target(5.0, "< 5 MB (flat)"),
            note=f"{len(rss)} readings, {min(rss[quarter:]):.0f}..{max(rss):.0f} MB after start-up",
        ),
        summarise("rss.parent.cpu_share", f"{title}: CPU share", [100 * cpu_s / wall_s], "% core"),
    ]
    if samples:
        note = f"{samples} samples in {wall_s:.0f} s; host + NVML + agent channel + writer"
        figures.append(
            summarise(
                "rss.parent.cpu_per_sample",
                f"{title}: CPU per sample",
                [1e6 * cpu_s / samples],
                "µs",
                note=note,
            )
        )
    return figures
