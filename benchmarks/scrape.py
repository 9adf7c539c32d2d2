"""What one Prometheus scrape costs at 8 devices and 64 processes, CPU and wall time."""

from __future__ import annotations

import random
import time
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from benchmarks.harness import Context, Figure, summarise
from memdoc.metrics.families import MemdocCollector
from memdoc.metrics.identity import JobIdentity
from memdoc.metrics.server import serve
from memdoc.metrics.sources import TraceFileSource
from memdoc.trace import (
    SCHEMA_VERSION,
    DeviceInfo,
    Event,
    EventKind,
    Header,
    Metric,
    ProcessInfo,
    SeriesKey,
    TraceWriter,
)

DEVICES = 8
PROCESSES = 64  # eight per device: ranks, DataLoader workers holding a context, others
INTERVAL_S = 0.1
SCRAPE_INTERVAL_S = 15.0  # Prometheus' usual scrape interval
GiB = 1024**3
MiB = 1024**2
TORCH = ("allocated", "reserved", "allocated_peak", "reserved_peak", "active", "inactive_split")
TITLE = f"scrape, {DEVICES} devices, {PROCESSES} processes"


class SyntheticNode:
    """A synthetic `memdoc run` of an 8-GPU node: the parent's rows and every rank's counters."""

    def __init__(self, path: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.t0 = time.time() - 3600
        self.tick = 0
        header = Header(version=SCHEMA_VERSION, created_unix=self.t0, memdoc_version="bench", pid=1)
        self.writer = TraceWriter(path, header, force=True)
        for d in range(DEVICES):
            self.writer.device(DeviceInfo(d, "NVIDIA H100 80GB HBM3", total_bytes=80 * GiB))
        for p in range(PROCESSES):
            self.writer.process(
                ProcessInfo(pid=1000 + p, t=self.t0, rank=p, local_rank=p % DEVICES)
            )

    def write(self, seconds: float) -> None:
        for _ in range(round(seconds / INTERVAL_S)):
            self.tick += 1
            t = self.t0 + self.tick * INTERVAL_S
            self.writer.samples(t, self._row())
            if self.tick % 7 == 0:
                self.writer.event(Event(t, EventKind.STEP, pid=1000, data={"step": self.tick}))
        self.writer.flush_if_due()

    def _row(self) -> dict[SeriesKey, int]:
        rng = self.rng
        row: dict[SeriesKey, int] = {
            SeriesKey(Metric.HOST_RSS): 40 * GiB + rng.randrange(GiB),
            SeriesKey(Metric.HOST_AVAILABLE): 900 * GiB,
            SeriesKey(Metric.HOST_TOTAL): 2048 * GiB,
        }
        for d in range(DEVICES):
            row[SeriesKey(Metric.GPU_USED, d)] = 70 * GiB + rng.randrange(GiB)
            row[SeriesKey(Metric.GPU_FREE, d)] = 9 * GiB
            row[SeriesKey(Metric.GPU_TOTAL, d)] = 80 * GiB
        for p in range(PROCESSES):
            pid, device = 1000 + p, p % DEVICES
            for quantity in TORCH:
                row[SeriesKey(f"torch.{quantity}", device, pid)] = 8 * GiB + rng.randrange(GiB)
            if self.tick % 30 == 0:  # NVML process lists: every 3 s
                row[SeriesKey(Metric.GPU_PROC_USED, device, pid)] = 9 * GiB + 500 * MiB
            if self.tick % 10 == 0:
                row[SeriesKey(Metric.HOST_RSS, None, pid)] = 5 * GiB
        return row


def _cpu_and_wall(action: object) -> tuple[float, float]:
    assert callable(action)
    cpu, wall = time.process_time(), time.perf_counter()
    action()
    return (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000


def scrape_group(ctx: Context) -> list[Figure]:
    history_s = ctx.pick(60.0, 300.0)
    scrapes = ctx.pick(3, 8)
    path = ctx.workdir / "scrape.memdoc"
    job = SyntheticNode(path, ctx.seed)
    ctx.log(f"writing {history_s:g} s of an {DEVICES}-GPU, {PROCESSES}-process run")
    job.write(history_s)
    source = TraceFileSource(path)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MemdocCollector(source, JobIdentity("bench", job="1")))

    first_cpu, first_wall = _cpu_and_wall(lambda: generate_latest(registry))
    steady_cpu, steady_wall, cached_cpu, http_wall = [], [], [], []
    server = serve(registry, 0)
    try:
        for _ in range(scrapes):
            job.write(SCRAPE_INTERVAL_S)  # what the run wrote since the last scrape
            cpu, wall = _cpu_and_wall(lambda: generate_latest(registry))
            steady_cpu.append(cpu)
            steady_wall.append(wall)
            cached_cpu.append(_cpu_and_wall(lambda: generate_latest(registry))[0])
            http_wall.append(_cpu_and_wall(lambda: urllib.request.urlopen(server.url).read())[1])
    finally:
        server.stop()
        job.writer.close()
    size = len(generate_latest(registry))
    values_per_scrape = round(SCRAPE_INTERVAL_S / INTERVAL_S) * len(job._row())
    return [
        summarise(
            "scrape.first",
            f"{TITLE}: first scrape (reads {history_s:g} s of trace, runs the catalogue)",
            [first_cpu],
            "ms CPU",
            note=f"wall {first_wall:.0f} ms",
        ),
        summarise(
            "scrape.steady",
            f"{TITLE}: every {SCRAPE_INTERVAL_S:g} s (reads new values, runs the catalogue)",
            steady_cpu,
            "ms CPU",
            note=f"wall median {sorted(steady_wall)[len(steady_wall) // 2]:.0f} ms; "
            f"{values_per_scrape:,} new values each",
        ),
        summarise(
            "scrape.nothing-new",
            f"{TITLE}: nothing new, catalogue cached (the exposition alone)",
            cached_cpu,
            "ms CPU",
            note=f"{size:,} bytes of exposition",
        ),
        summarise(
            "scrape.http",
            f"{TITLE}: HTTP GET, nothing new (wall, client included)",
            http_wall,
            "ms",
        ),
    ]
