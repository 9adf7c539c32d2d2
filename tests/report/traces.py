"""Realistic traces for report tests, written with the real TraceWriter.

Device sizes are what the driver reports: an H200 has 150754820096 bytes. The OOM scenario
uses a PyTorch 2.2+ message quoted in the OOM message catalogue (section 1g), whose
numbers describe a 16 GB card; the trace around it is built to agree with them.
"""

from __future__ import annotations

import math
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
    ProcessUsage,
    SeriesKey,
    Trace,
    TraceWriter,
)
from memdoc.units import GiB, MiB, parse_size

T0 = 1764687600.0
# A real PyTorch snapshot taken at an OOM; its SOURCES.md sits beside it.
SNAPSHOT = (
    Path(__file__).resolve().parent.parent
    / "fixtures/importers/torch-snapshots-flexgen/oom_snapshot.pickle"
)
H200_TOTAL = 150754820096
PID = 4243
OTHER_PID = 9001

# Source: sgl-project/sglang#5576 (quoted in the OOM message catalogue, section 1g).
OOM_MESSAGE_1G = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 226.00 MiB. GPU 0 has a total "
    "capacity of 15.58 GiB of which 71.25 MiB is free. Including non-PyTorch memory, this process "
    "has 13.94 GiB memory in use. Of the allocated memory 13.64 GiB is allocated by PyTorch, and "
    "67.23 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def _size(text: str) -> int:
    value = parse_size(text)
    assert value is not None
    return value


def oom_1g() -> OomInfo:
    """The catalogue message's fields, as the PyTorch parser reads them."""
    return OomInfo(
        framework="pytorch",
        kind="allocator",
        message=OOM_MESSAGE_1G,
        device=0,
        device_type="gpu",
        requested_bytes=_size("226.00 MiB"),
        total_bytes=_size("15.58 GiB"),
        free_bytes=_size("71.25 MiB"),
        this_process_bytes=_size("13.94 GiB"),
        allocated_bytes=_size("13.64 GiB"),
        reserved_unallocated_bytes=_size("67.23 MiB"),
    )


def header(
    command: tuple[str, ...], *, t0: float = T0, rank: int | None = None, world: int | None = None
) -> Header:
    return Header(
        version=SCHEMA_VERSION,
        created_unix=t0,
        memdoc_version="0.1.0",
        command=command,
        host="gpu-node-07",
        pid=PID - 1,
        cwd="/home/user/project",
        python="3.12.3",
        interval_s=0.1,
        env={"CUDA_VISIBLE_DEVICES": "0"} if rank is None else {"LOCAL_RANK": str(rank)},
        rank=rank,
        world_size=world,
    )


def _torch_values(
    device: int, allocated: float, peak: float, reserved: float
) -> dict[SeriesKey, float]:
    return {
        SeriesKey("torch.allocated", device, PID): allocated,
        SeriesKey("torch.allocated_peak", device, PID): peak,
        SeriesKey("torch.reserved", device, PID): reserved,
        SeriesKey("torch.reserved_peak", device, PID): reserved,
    }


def _training(
    w: TraceWriter,
    *,
    devices: list[int],
    total: int,
    steps: int,
    t0: float,
    start_bytes: float,
    adam_bytes: float,
    leak_per_step: float,
    activation_bytes: float,
    other_bytes: float,
    samples_per_step: int = 5,
) -> tuple[float, float]:
    """Record a training loop; return (time of the last sample, allocated at the end)."""
    t = 0.0
    live = start_bytes
    context = 0.23 * GiB
    driver = 0.27 * GiB
    for step in range(1, steps + 1):
        after = start_bytes + adam_bytes + leak_per_step * (step - 1)
        for i in range(samples_per_step):
            t = (step - 1) * 0.5 + i * 0.1 + 0.05
            phase = math.sin(math.pi * (i + 0.5) / samples_per_step)
            live = after - (adam_bytes if step == 1 and i < 3 else 0.0) + activation_bytes * phase
            reserved = math.ceil((after + activation_bytes) / (2 * MiB)) * 2 * MiB
            values: dict[SeriesKey, float] = {
                SeriesKey(Metric.HOST_RSS): 3.1 * GiB + step * 4 * MiB,
            }
            for d in devices:
                values.update(_torch_values(d, live, live + activation_bytes * 0.2, reserved))
                used = reserved + context + other_bytes * (d == 0) + driver
                values[SeriesKey(Metric.GPU_USED, d)] = used
                values[SeriesKey(Metric.GPU_FREE, d)] = total - used
                if i == 0 and step % 4 == 1:
                    values[SeriesKey(Metric.GPU_PROC_USED, d, PID)] = reserved + context
                    if other_bytes and d == 0:
                        values[SeriesKey(Metric.GPU_PROC_USED, d, OTHER_PID)] = other_bytes
            w.samples(t0 + t, values)
        w.event(
            Event(
                t0 + step * 0.5 - 0.01, EventKind.STEP, PID, {"step": step, "source": "optimizer"}
            )
        )
    return t, live


def _preamble(w: TraceWriter, devices: list[DeviceInfo], t0: float, version: str = "2.5.1") -> None:
    w.devices(devices)
    w.process(ProcessInfo(PID, t0 + 0.01, PID - 1, ("python", "train.py"), True))
    w.event(Event(t0 + 0.02, EventKind.FRAMEWORK, PID, {"name": "pytorch", "version": version}))


def write_oom_run(
    path: Path,
    *,
    command: tuple[str, ...] = ("train.py", "--batch-size", "64"),
    steps: int = 46,
    mark: str = "warmup done",
    snapshot: str | None = None,
) -> Path:
    """A PyTorch job on a 16 GB card that leaks a little each step and fails with the 1g message."""
    oom = oom_1g()
    total = oom.total_bytes
    assert total is not None
    w = TraceWriter(path, header(command))
    _preamble(w, [DeviceInfo(0, "NVIDIA RTX A4000", total, "GPU-5f3c1a2e")], T0)
    w.process(ProcessInfo(OTHER_PID, T0 + 0.01, 1, ("python", "notebook_kernel.py"), False))
    w.event(Event(T0 + 1.2, EventKind.MARK, PID, {"label": mark}))
    t, _ = _training(
        w,
        devices=[0],
        total=total,
        steps=steps,
        t0=T0,
        start_bytes=6.0 * GiB,
        adam_bytes=2.6 * GiB,
        leak_per_step=0.104 * GiB,
        activation_bytes=0.35 * GiB,
        other_bytes=1.0 * GiB,
    )
    t_oom = t + 0.2
    stack = ["train.py:88:<module>", "train.py:61:train_step", "model.py:40:forward"]
    w.event(
        Event(
            T0 + t_oom, EventKind.OOM, PID, {"oom": oom.to_dict(), "stack": stack, "handled": False}
        )
    )
    w.event(
        Event(
            T0 + t_oom + 0.01,
            EventKind.EXCEPTION,
            PID,
            {"type": "torch.OutOfMemoryError", "message": OOM_MESSAGE_1G, "where": "uncaught"},
        )
    )
    if snapshot is not None:
        data = {"path": snapshot, "reason": "oom"}
        w.event(Event(T0 + t_oom + 0.05, EventKind.SNAPSHOT, PID, data))
    w.close(ExitInfo(T0 + t_oom + 0.3, exit_code=1))
    return path


def write_clean_h200_run(path: Path, *, devices: int = 2, steps: int = 60) -> Path:
    """Data-parallel training on H200s that finishes normally, with eval marks."""
    w = TraceWriter(path, header(("train.py", "--config", "llama-8b.yaml")))
    infos = [DeviceInfo(d, "NVIDIA H200", H200_TOTAL, f"GPU-{d:08x}") for d in range(devices)]
    _preamble(w, infos, T0)
    for k in (10, 30, 50):
        w.event(Event(T0 + k * 0.5 + 0.2, EventKind.MARK, PID, {"label": "eval"}))
    t, _ = _training(
        w,
        devices=list(range(devices)),
        total=H200_TOTAL,
        steps=steps,
        t0=T0,
        start_bytes=30.0 * GiB,
        adam_bytes=30.0 * GiB,
        leak_per_step=0.0,
        activation_bytes=24.0 * GiB,
        other_bytes=0.0,
    )
    w.close(ExitInfo(T0 + t + 0.2, exit_code=0))
    return path


def write_rank_traces(folder: Path, *, world: int = 4, failing_rank: int = 2) -> list[Path]:
    """One trace per rank; one rank runs out of memory first and torchrun stops the others."""
    paths: list[Path] = []
    for rank in range(world):
        path = folder / f"run.rank{rank}.memdoc"
        t0 = T0 + 0.05 * rank
        w = TraceWriter(path, header(("train.py",), t0=t0, rank=rank, world=world))
        _preamble(w, [DeviceInfo(rank, "NVIDIA H200", H200_TOTAL, f"GPU-{rank:08x}")], t0)
        extra = 9.0 * GiB if rank == failing_rank else 0.0
        t, allocated = _training(
            w,
            devices=[rank],
            total=H200_TOTAL,
            steps=30,
            t0=t0,
            start_bytes=50.0 * GiB + extra,
            adam_bytes=40.0 * GiB,
            leak_per_step=0.5 * GiB,
            activation_bytes=20.0 * GiB,
            other_bytes=0.0,
        )
        if rank == failing_rank:
            oom = OomInfo(
                framework="pytorch",
                message=f"[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. "
                "Tried to allocate 8.00 GiB.",
                device=rank,
                requested_bytes=8 * GiB,
                total_bytes=H200_TOTAL,
                free_bytes=3 * GiB,
                allocated_bytes=int(allocated),
                reserved_unallocated_bytes=int(1.5 * GiB),
                processes=(ProcessUsage(PID, int(allocated + 1.8 * GiB), True),),
                rank=rank,
            )
            w.event(Event(t0 + t + 0.1, EventKind.OOM, PID, {"oom": oom.to_dict()}))
            w.close(ExitInfo(t0 + t + 0.3, exit_code=1))
        else:
            w.close(ExitInfo(t0 + t + 1.5, signal=15))
        paths.append(path)
    return paths


def write_host_only_run(
    path: Path, *, command: tuple[str, ...] = ("prepare.py",), steps: int = 40
) -> Path:
    """No GPU: host memory grows step after step until the kernel kills the job."""
    w = TraceWriter(path, header(command))
    w.collector(
        CollectorStatus(
            "nvml",
            False,
            T0,
            PID - 1,
            "NVML not found: no NVIDIA driver on this machine",
            "showing host memory only",
        )
    )
    limit = 8 * GiB
    t = 0.0
    for step in range(1, steps + 1):
        for i in range(4):
            t = (step - 1) * 0.4 + i * 0.1 + 0.05
            rss = 1.2 * GiB + step * 160 * MiB + i * 20 * MiB
            w.samples(
                T0 + t,
                {
                    SeriesKey(Metric.HOST_RSS): rss,
                    SeriesKey(Metric.CGROUP_USAGE): rss + 200 * MiB,
                    SeriesKey(Metric.CGROUP_LIMIT): limit,
                },
            )
        w.event(
            Event(T0 + step * 0.4 - 0.01, EventKind.STEP, PID, {"step": step, "source": "user"})
        )
    w.close(ExitInfo(T0 + t + 0.1, signal=9))
    return path


def million_value_trace(values: int = 1_000_000, series: int = 10) -> Trace:
    """A long run in memory: `values` recorded values over `series` series, with spikes."""
    trace = Trace(header(("train.py", "--epochs", "100")))
    trace.add_device(DeviceInfo(0, "NVIDIA H200", H200_TOTAL))
    keys = [
        SeriesKey(Metric.GPU_USED, 0),
        SeriesKey(Metric.GPU_FREE, 0),
        SeriesKey("torch.allocated", 0, PID),
        SeriesKey("torch.allocated_peak", 0, PID),
        SeriesKey("torch.reserved", 0, PID),
        SeriesKey("torch.reserved_peak", 0, PID),
        SeriesKey(Metric.HOST_RSS),
        SeriesKey(Metric.HOST_AVAILABLE),
        SeriesKey("torch.inactive_split", 0, PID),
        SeriesKey("torch.active", 0, PID),
    ][:series]
    rows = values // len(keys)
    for i in range(rows):
        t = i * 0.01
        base = 40 * GiB + (i % 500) * 8 * MiB + (30 * GiB if i % 9973 == 0 else 0)
        trace.add_values(t, [(k, float(base + j * GiB)) for j, k in enumerate(keys)])
        if i % 500 == 499:
            trace.add_event(Event(t, EventKind.STEP, PID, {"step": i // 500 + 1}))
    return trace
