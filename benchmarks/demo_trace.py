"""A synthetic training run written as a trace: for the dashboard's benchmark, demos and tests.

Run `python -m benchmarks.demo_trace OUT.memdoc --live` to write one in real time, then follow it
with `memdoc live OUT.memdoc` from another terminal.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
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
from memdoc.units import GiB, MiB

# An H100 80GB as NVML reports it (81559 MiB total).
DEVICE_NAME = "NVIDIA H100 80GB HBM3"
DEVICE_TOTAL_BYTES = 81559 * MiB
PARENT_PID = 4242
OTHER_PID = 9001  # a process that is not ours, on device 0
OTHER_BYTES = 6 * GiB
CONTEXT_BYTES = 600 * MiB
DRIVER_BYTES = 512 * MiB
SEGMENT_BYTES = 2 * GiB  # the pool grows in whole segments and never shrinks
# What the pool can grow to on device 0 (which also hosts the other process).
POOL_ROOM_BYTES = DEVICE_TOTAL_BYTES - CONTEXT_BYTES - DRIVER_BYTES - OTHER_BYTES - GiB


@dataclass(frozen=True)
class DemoRun:
    """The shape of the synthetic run: one rank per device, steps, an eval phase, an OOM."""

    devices: int = 2
    seconds: float = 30.0
    rate_hz: float = 10.0
    step_s: float = 0.5
    oom: bool = True
    created_unix: float = 1_700_000_000.0
    base_bytes: int = 30 * GiB  # weights, gradients and optimizer state
    activation_bytes: int = 24 * GiB  # the in-step working set at its highest

    @property
    def leak_bytes_per_step(self) -> float:
        """Leaked so that the last step's peak just reaches what device 0 can give the pool."""
        steps = max(1.0, self.seconds / self.step_s)
        room = POOL_ROOM_BYTES - self.base_bytes - self.activation_bytes
        return max(0.0, room / steps)

    def rank_pid(self, device: int) -> int:
        return PARENT_PID + 1 + device

    def allocated(self, device: int, t: float) -> float:
        step = int(t / self.step_s)
        phase = (t % self.step_s) / self.step_s
        activations = self.activation_bytes * math.sin(math.pi * phase) * (1 - 0.05 * device)
        return self.base_bytes + step * self.leak_bytes_per_step + activations


def write_demo_trace(
    path: str | Path, run: DemoRun = DemoRun(), *, live: bool = False, force: bool = False
) -> Path:
    """Write the run to `path`; with `live`, at the pace of the real clock (Ctrl-C stops it)."""
    path = Path(path)
    created = time.time() if live else run.created_unix
    writer = TraceWriter(path, _header(run, created), force=force)
    try:
        _write_preamble(writer, run, created)
        reserved = [0.0] * run.devices
        samples = int(run.seconds * run.rate_hz)
        started = time.monotonic()
        for i in range(1, samples + 1):
            t = i / run.rate_hz
            if live:
                time.sleep(max(0.0, started + t - time.monotonic()))
            writer.samples(created + t, _values(run, t, reserved))
            _events(writer, run, created, t)
        if run.oom:
            _write_oom(writer, run, created, run.seconds, reserved[0])
        end = ExitInfo(t=created + run.seconds + 0.05, exit_code=1 if run.oom else 0)
        writer.close(end)
    finally:
        writer.close()
    return path


def _header(run: DemoRun, created: float) -> Header:
    return Header(
        version=SCHEMA_VERSION,
        created_unix=created,
        memdoc_version="demo",
        command=("torchrun", f"--nproc-per-node={run.devices}", "train.py", "--batch", "64"),
        host="gpu-node-7",
        pid=PARENT_PID,
        interval_s=1 / run.rate_hz,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
    )


def _write_preamble(writer: TraceWriter, run: DemoRun, created: float) -> None:
    writer.collector(CollectorStatus("nvml", True, t=created, version="550.54.15"))
    for device in range(run.devices):
        writer.device(DeviceInfo(device, DEVICE_NAME, DEVICE_TOTAL_BYTES, f"GPU-demo-{device}"))
    writer.process(ProcessInfo(PARENT_PID, created, command=("torchrun", "train.py"), user="ml"))
    for device in range(run.devices):
        command = ("python", "train.py", f"--local-rank={device}")
        writer.process(ProcessInfo(run.rank_pid(device), created, PARENT_PID, command, user="ml"))
    serve = ("python", "serve.py", "--port", "8000")
    writer.process(ProcessInfo(OTHER_PID, created, 1, serve, ours=False, user="alice"))
    writer.event(Event(created, EventKind.MARK, run.rank_pid(0), {"label": "train"}))


def _values(run: DemoRun, t: float, reserved: list[float]) -> dict[SeriesKey, int | float]:
    values: dict[SeriesKey, int | float] = {}
    tree_rss = 0
    for device in range(run.devices):
        pid = run.rank_pid(device)
        allocated = run.allocated(device, t)
        peak = max(allocated, run.allocated(device, t - 0.5 / run.rate_hz))
        peak += 1.5 * GiB if int(t * run.rate_hz) % 7 == 0 else 0  # a spike between samples
        peak = min(peak, POOL_ROOM_BYTES)
        segments = math.ceil(peak / SEGMENT_BYTES) * SEGMENT_BYTES
        reserved[device] = max(reserved[device], min(segments, POOL_ROOM_BYTES))
        proc_used = reserved[device] + CONTEXT_BYTES
        used = proc_used + DRIVER_BYTES + (OTHER_BYTES if device == 0 else 0)
        rss = 3 * GiB + int(t * 8 * MiB)
        tree_rss += rss
        values.update(
            {
                SeriesKey("torch.allocated", device, pid): int(allocated),
                SeriesKey("torch.allocated_peak", device, pid): int(peak),
                SeriesKey("torch.reserved", device, pid): int(reserved[device]),
                SeriesKey(Metric.GPU_PROC_USED, device, pid): int(proc_used),
                SeriesKey(Metric.GPU_USED, device): int(used),
                SeriesKey(Metric.GPU_FREE, device): int(DEVICE_TOTAL_BYTES - used),
                SeriesKey(Metric.GPU_TOTAL, device): DEVICE_TOTAL_BYTES,
                SeriesKey(Metric.HOST_RSS, pid=pid): rss,
            }
        )
    values[SeriesKey(Metric.GPU_PROC_USED, 0, OTHER_PID)] = OTHER_BYTES
    values[SeriesKey(Metric.HOST_RSS)] = tree_rss + 400 * MiB
    values[SeriesKey(Metric.HOST_AVAILABLE)] = 1800 * GiB - tree_rss
    values[SeriesKey(Metric.HOST_TOTAL)] = 2015 * GiB
    values[SeriesKey(Metric.HOST_SWAP_USED)] = 0
    return values


def _events(writer: TraceWriter, run: DemoRun, created: float, t: float) -> None:
    dt = 1 / run.rate_hz
    step_now, step_before = int(t / run.step_s), int((t - dt) / run.step_s)
    pid = run.rank_pid(0)
    if step_now > step_before:
        writer.event(
            Event(created + step_now * run.step_s, EventKind.STEP, pid, {"step": step_now})
        )
    eval_t = run.seconds * 0.6
    for label, at in (("eval", eval_t), ("train", eval_t + run.seconds * 0.1)):
        if t - dt < at <= t:
            writer.event(Event(created + at, EventKind.MARK, pid, {"label": label}))


def _write_oom(
    writer: TraceWriter, run: DemoRun, created: float, t: float, reserved: float
) -> None:
    requested = 4 * GiB
    allocated = int(run.allocated(0, t))
    free = int(DEVICE_TOTAL_BYTES - reserved - CONTEXT_BYTES - DRIVER_BYTES - OTHER_BYTES)
    message = (
        f"CUDA out of memory. Tried to allocate {requested / GiB:.2f} GiB. GPU 0 has a total "
        f"capacity of {DEVICE_TOTAL_BYTES / GiB:.2f} GiB of which {max(0, free) / GiB:.2f} GiB "
        f"is free. Process {OTHER_PID} has {OTHER_BYTES / GiB:.2f} GiB memory in use."
    )
    oom = OomInfo(
        framework="pytorch",
        device=0,
        requested_bytes=requested,
        total_bytes=DEVICE_TOTAL_BYTES,
        free_bytes=max(0, free),
        allocated_bytes=allocated,
        reserved_bytes=int(reserved),
        message=message,
    )
    writer.event(Event(created + t, EventKind.OOM, run.rank_pid(0), {"oom": oom.to_dict()}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a synthetic training-run trace.")
    parser.add_argument("output")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--live", action="store_true", help="write at the pace of the clock")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    run = DemoRun(devices=args.devices, seconds=args.seconds)
    try:
        write_demo_trace(args.output, run, live=args.live, force=args.force)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
