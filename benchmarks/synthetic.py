"""A realistic large trace: several GPUs, one rank each, NVML + framework + host series, an OOM."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memdoc.trace import (
    SCHEMA_VERSION,
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    ExitInfo,
    Header,
    Metric,
    OomInfo,
    ProcessInfo,
    SeriesKey,
    TraceWriter,
)

GiB = 1024**3
MiB = 1024**2
DEVICE_TOTAL = 80 * GiB
INTERVAL_S = 0.1
TICKS_PER_STEP = 7
CREATED_UNIX = 1_764_687_600.0
PARENT_PID = 4242
TORCH_QUANTITIES = (
    "allocated",
    "reserved",
    "allocated_peak",
    "reserved_peak",
    "active",
    "inactive_split",
)


def rank_pid(rank: int) -> int:
    return PARENT_PID + 1 + rank


@dataclass
class Row:
    """The values one writer call records at one instant."""

    t: float
    values: dict[SeriesKey, int]


class _Rank:
    """One training rank's allocator: weights, a saw-tooth of activations, a slow leak."""

    def __init__(self, rank: int, rng: random.Random) -> None:
        self.rank = rank
        self.rng = rng
        self.weights = 22 * GiB + rank * 64 * MiB
        self.leak = 0
        self.reserved = self.weights + 4 * GiB

    def values(self, phase: float) -> dict[SeriesKey, int]:
        activations = int(30 * GiB * phase) + self.rng.randrange(0, 64 * MiB)
        allocated = self.weights + self.leak + activations
        self.reserved = max(self.reserved, allocated + self.rng.randrange(0, 512 * MiB))
        peak = allocated + self.rng.randrange(0, 256 * MiB)
        numbers = (
            allocated,
            self.reserved,
            peak,
            self.reserved,
            allocated,
            self.reserved - allocated,
        )
        pid = rank_pid(self.rank)
        return {
            SeriesKey(f"torch.{q}", self.rank, pid): v
            for q, v in zip(TORCH_QUANTITIES, numbers, strict=True)
        }


def rows(values_wanted: int, seed: int, devices: int) -> Iterator[Row]:
    """Rows in time order until about `values_wanted` values: each tick, one parent row
    (host and NVML) and one row per rank (its framework allocator)."""
    rng = random.Random(seed)
    ranks = [_Rank(r, rng) for r in range(devices)]
    written = 0
    tick = 0
    while written < values_wanted:
        t = CREATED_UNIX + 0.5 + tick * INTERVAL_S
        phase = (tick % TICKS_PER_STEP) / TICKS_PER_STEP  # activations rise, then are freed
        ranks[tick % devices].leak += rng.randrange(0, 2 * MiB)
        per_rank = [r.values(phase) for r in ranks]
        for row in (_parent_values(tick, per_rank, rng), *per_rank):
            written += len(row)
            yield Row(t, row)
        tick += 1


def _parent_values(
    tick: int, per_rank: list[dict[SeriesKey, int]], rng: random.Random
) -> dict[SeriesKey, int]:
    values: dict[SeriesKey, int] = {SeriesKey(Metric.HOST_RSS, pid=PARENT_PID): 300 * MiB}
    for rank in range(len(per_rank)):
        values[SeriesKey(Metric.HOST_RSS, pid=rank_pid(rank))] = 6 * GiB + rng.randrange(
            0, 32 * MiB
        )
    rss_total = sum(values.values())
    values[SeriesKey(Metric.HOST_RSS)] = rss_total
    values[SeriesKey(Metric.HOST_AVAILABLE)] = 400 * GiB - rss_total
    values[SeriesKey(Metric.HOST_TOTAL)] = 512 * GiB
    for device, framework in enumerate(per_rank):
        used = framework[SeriesKey("torch.reserved", device, rank_pid(device))] + 600 * MiB
        values[SeriesKey(Metric.GPU_USED, device)] = used
        values[SeriesKey(Metric.GPU_FREE, device)] = DEVICE_TOTAL - used
        values[SeriesKey(Metric.GPU_TOTAL, device)] = DEVICE_TOTAL
        if tick % 30 == 0:  # NVML process lists are read every 3 s
            values[SeriesKey(Metric.GPU_PROC_USED, device, rank_pid(device))] = used
    return values


def write_trace(
    path: Path, values_wanted: int, *, seed: int, devices: int = 4
) -> tuple[TraceWriter, float]:
    """Write the trace; (the closed writer, seconds spent in writer calls)."""
    pending = list(rows(values_wanted, seed, devices))  # generated first: only the writer is timed
    rows_per_step = TICKS_PER_STEP * (devices + 1)
    start = time.perf_counter()
    writer = _open(path, devices)
    for index, row in enumerate(pending):
        writer.samples(row.t, row.values)
        if index and index % rows_per_step == 0:
            for rank in range(devices):
                data = {"step": index // rows_per_step, "source": "optimizer"}
                writer.event(Event(row.t, EventKind.STEP, rank_pid(rank), data))
    _finish(writer, pending[-1].t + 0.05)
    return writer, time.perf_counter() - start


def _open(path: Path, devices: int) -> TraceWriter:
    header = Header(
        version=SCHEMA_VERSION,
        created_unix=CREATED_UNIX,
        memdoc_version="bench",
        command=("torchrun", "--nproc-per-node", str(devices), "train.py"),
        host="node7",
        pid=PARENT_PID,
        interval_s=INTERVAL_S,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
    )
    writer = TraceWriter(path, header, force=True)
    for device in range(devices):
        writer.device(
            DeviceInfo(device, "NVIDIA A100-SXM4-80GB", DEVICE_TOTAL, f"GPU-{device:08d}")
        )
    writer.collector(CollectorStatus("nvml", True, CREATED_UNIX, PARENT_PID, version="550.54.15"))
    writer.process(ProcessInfo(PARENT_PID, CREATED_UNIX, command=("torchrun",)))
    for rank in range(devices):
        pid = rank_pid(rank)
        writer.process(ProcessInfo(pid, CREATED_UNIX + 0.3, PARENT_PID, ("python", "train.py")))
        writer.collector(CollectorStatus("pytorch", True, CREATED_UNIX + 0.4, pid, version="2.5.1"))
        framework = {"name": "pytorch", "version": "2.5.1"}
        writer.event(Event(CREATED_UNIX + 0.4, EventKind.FRAMEWORK, pid, framework))
    return writer


def _finish(writer: TraceWriter, end_t: float) -> None:
    oom = OomInfo(
        framework="pytorch",
        kind="allocator",
        device=0,
        requested_bytes=2 * GiB,
        total_bytes=DEVICE_TOTAL,
        free_bytes=1200 * MiB,
        allocated_bytes=74 * GiB,
        reserved_bytes=77 * GiB,
        message="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 1.17 GiB is free.",
    )
    stack = ["train.py:88:<module>", "train.py:61:train_step", "model.py:140:forward"]
    pid = rank_pid(0)
    writer.event(Event(end_t, EventKind.OOM, pid, {"oom": oom.to_dict(), "stack": stack}))
    exception = {
        "type": "torch.OutOfMemoryError",
        "message": oom.message,
        "stack": stack,
        "where": "uncaught",
    }
    writer.event(Event(end_t, EventKind.EXCEPTION, pid, exception))
    writer.close(ExitInfo(end_t + 0.2, exit_code=1))


def shared_trace(
    workdir: Path, shared: dict[str, object], *, values: int, devices: int
) -> tuple[Path, int, float]:
    """A trace built once per benchmark run and reused: (path, values written, write seconds)."""
    name = f"trace-{values}-{devices}"
    cached = shared.get(name)
    if isinstance(cached, tuple):
        return cached
    path = workdir / f"{name}.memdoc"
    writer, seconds = write_trace(path, values, seed=7, devices=devices)
    result = (path, writer.values_written, seconds)
    shared[name] = result
    return result


def million_value_trace(workdir: Path, shared: dict[str, object]) -> tuple[Path, int, float]:
    """The one-million-value trace of the trace, diagnose and report figures."""
    return shared_trace(workdir, shared, values=1_000_000, devices=4)
