"""Write small, deterministic traces with the real TraceWriter: the rule fixtures' builder."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from memdoc.trace import (
    SCHEMA_VERSION,
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
T0 = 1_764_000_000.0  # fixed, so a rebuilt fixture is byte-identical
PID = 4243


def torch_key(quantity: str, device: int = 0, pid: int = PID) -> SeriesKey:
    return SeriesKey(f"torch.{quantity}", device, pid)


class Recorder:
    """A trace being written: times are seconds since the start, values bytes."""

    def __init__(
        self,
        path: Path,
        *,
        env: dict[str, str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        pid: int = PID,
        t0: float = T0,
    ) -> None:
        header = Header(
            version=SCHEMA_VERSION,
            created_unix=t0,
            memdoc_version="0.1.0",
            command=("train.py",),
            host="node1",
            pid=pid - 1,
            interval_s=0.1,
            env=dict(env or {}),
            rank=rank,
            world_size=world_size,
        )
        self.t0 = t0
        self.pid = pid
        self.writer = TraceWriter(path, header, force=True)
        self.process(pid)

    def process(
        self, pid: int, *, ours: bool = True, command: Sequence[str] = ("python", "train.py")
    ) -> None:
        self.writer.process(
            ProcessInfo(pid=pid, t=self.t0, ppid=self.pid - 1, command=tuple(command), ours=ours)
        )

    def device(self, index: int, total_bytes: int, name: str) -> None:
        self.writer.device(DeviceInfo(index=index, name=name, total_bytes=total_bytes))

    def sample(self, t: float, values: dict[SeriesKey, float]) -> None:
        self.writer.samples(self.t0 + t, values)

    def event(self, t: float, kind: str, pid: int | None = None, **data: Any) -> None:
        self.writer.event(Event(t=self.t0 + t, kind=kind, pid=pid or self.pid, data=data))

    def step(self, t: float, number: int) -> None:
        self.event(t, EventKind.STEP, step=number, source="optimizer")

    def mark(self, t: float, label: str, **data: Any) -> None:
        self.event(t, EventKind.MARK, label=label, **data)

    def oom(self, t: float, oom: OomInfo, stack: Iterable[str] = ()) -> None:
        self.event(t, EventKind.OOM, oom=oom.to_dict(), stack=list(stack))

    def end(self, t: float, *, exit_code: int | None = None, signal: int | None = None) -> None:
        self.writer.close(ExitInfo(t=self.t0 + t, exit_code=exit_code, signal=signal))


def train_steps(
    rec: Recorder,
    steps: int,
    *,
    baseline: Callable[[int], float],
    rise: Callable[[int], float],
    t_start: float = 1.0,
    step_s: float = 1.0,
    device: int = 0,
    reserved: Callable[[int], float] | None = None,
    metric: str | None = None,
) -> float:
    """Record a training loop: each step rises from its baseline, peaks, and settles.

    `baseline(k)` is the memory after step k (k from 1); `rise(k)` the in-step peak above the
    previous baseline. Returns the time of the last step.
    """
    key = SeriesKey(metric, None, None) if metric else torch_key(Metric.ALLOCATED, device)
    peak_key = (
        SeriesKey(f"{metric}_peak", None, None)
        if metric
        else torch_key(Metric.ALLOCATED_PEAK, device)
    )
    t = t_start
    previous = baseline(0)
    rec.sample(t, {key: previous})
    for k in range(1, steps + 1):
        values = {key: previous + rise(k) * 0.9, peak_key: previous + rise(k)}
        if reserved is not None:
            values[torch_key(Metric.RESERVED, device)] = reserved(k)
        rec.sample(t + step_s * 0.5, values)
        t += step_s
        previous = baseline(k)
        rec.sample(t, {key: previous})
        rec.step(t, k)
    return t
