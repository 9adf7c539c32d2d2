"""Report data over time: every memory layer per device, host memory, events, and per-step stats."""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.report.downsample import DEFAULT_MAX_POINTS, minmax_downsample
from memdoc.rules.facts import (
    Curve,
    baseline_trend,
    framework_name,
    host_curve,
    job_host_curve,
    step_curve,
)
from memdoc.trace import EventKind, Metric, Series, StepStat, Trace
from memdoc.trace.ledger import run_pids
from memdoc.trace.model import framework_metric
from memdoc.trace.reader import oom_of, sum_series
from memdoc.units import format_bytes

# More step boundaries than this would draw a grey wall: show every n-th instead.
MAX_STEP_LINES = 400
MAX_MARKERS = 200
SAME_ERROR_S = 2.0


@dataclass(frozen=True)
class Line:
    """One layer over time, downsampled for drawing; `recorded` counts the values behind it."""

    name: str
    role: str  # used, process, reserved, allocated, peak, rss, cgroup, limit
    times_s: tuple[float, ...]
    values_bytes: tuple[float, ...]
    recorded: int


@dataclass(frozen=True)
class Panel:
    """The layers of one device (or of the host) sharing one y axis."""

    key: str
    title: str
    device: int | None
    total_bytes: int | None
    lines: tuple[Line, ...]


@dataclass(frozen=True)
class Marker:
    """Something to pin on the time axis: a mark, an OOM, an exception, the end."""

    t: float
    kind: str  # mark, oom, exception, exit
    label: str
    device: int | None = None


@dataclass(frozen=True)
class Timeline:
    panels: tuple[Panel, ...]
    step_times_s: tuple[float, ...]
    step_stride: int  # 1 when every step boundary is shown, n when every n-th
    markers: tuple[Marker, ...]
    duration_s: float


@dataclass(frozen=True)
class StepTable:
    """One memory curve read at step boundaries: baseline after, and peak inside, each step."""

    title: str
    metric: str
    device: int | None
    rows: tuple[StepStat, ...]
    growth_bytes_per_step: float | None  # as the findings fit it: after warm-up, robust
    start_bytes: float | None = None  # the first value recorded, before step 1


def _line(name: str, role: str, series: Series | None, max_points: int) -> Line | None:
    if series is None or not series.values:
        return None
    times, values = minmax_downsample(series.times, series.values, max_points)
    return Line(name, role, tuple(round(t, 3) for t in times), tuple(values), len(series))


def _summed(parts: Sequence[Series]) -> Series | None:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else sum_series(parts)


def device_panel(trace: Trace, device: int, max_points: int) -> Panel:
    """NVML device and per-process use, then each framework's pool, live bytes and peaks."""
    candidates: list[Line | None] = [
        _line("device used (driver)", "used", trace.series(Metric.GPU_USED, device), max_points)
    ]
    ours = run_pids(trace, device)
    mine = [s for s in trace.series_for(Metric.GPU_PROC_USED, device=device) if s.key.pid in ours]
    candidates.append(_line("this run (driver)", "process", _summed(mine), max_points))
    for fw in trace.frameworks():
        name = framework_name(fw)
        for quantity, label, role in (
            (Metric.RESERVED, "reserved", "reserved"),
            (Metric.ALLOCATED, "allocated", "allocated"),
            (Metric.ALLOCATED_PEAK, "interval peak", "peak"),
        ):
            parts = trace.series_for(framework_metric(fw, quantity), device=device)
            candidates.append(_line(f"{name} {label}", role, _summed(parts), max_points))
    title = "CPU (framework allocators)" if device < 0 else _device_title(trace, device)
    lines = tuple(line for line in candidates if line is not None)
    total = trace.device_total_bytes(device) if device >= 0 else None
    return Panel(f"device{device}", title, device, total, lines)


def _device_title(trace: Trace, device: int) -> str:
    info = trace.devices_by_index.get(device)
    name = f" · {info.name}" if info is not None and info.name else ""
    return f"GPU {device}{name}"


def host_panel(trace: Trace, max_points: int) -> Panel | None:
    """Host memory of the process tree, and the cgroup's usage and limit when there is one."""
    candidates = [
        _line("process tree RSS", "rss", trace.series(Metric.HOST_RSS), max_points),
        _line("cgroup usage", "cgroup", trace.series(Metric.CGROUP_USAGE), max_points),
        _line("cgroup limit", "limit", trace.series(Metric.CGROUP_LIMIT), max_points),
    ]
    lines = tuple(line for line in candidates if line is not None)
    if not lines:
        return None
    total = trace.series(Metric.HOST_TOTAL)
    last = total.last() if total is not None else None
    return Panel("host", "Host memory", None, int(last[1]) if last else None, lines)


def build_timeline(trace: Trace, max_points: int = DEFAULT_MAX_POINTS) -> Timeline:
    panels = [device_panel(trace, d.index, max_points) for d in trace.devices()]
    panels = [p for p in panels if p.lines]
    host = host_panel(trace, max_points)
    if host is not None:
        panels.append(host)
    step_times = trace.steps().times()
    stride = max(1, math.ceil(len(step_times) / MAX_STEP_LINES))
    return Timeline(
        panels=tuple(panels),
        step_times_s=tuple(step_times[stride - 1 :: stride]),
        step_stride=stride,
        markers=tuple(markers(trace)),
        duration_s=trace.duration_s,
    )


def markers(trace: Trace) -> list[Marker]:
    """Marks, OOMs, uncaught exceptions and an abnormal end, in time order."""
    found: list[Marker] = []
    for event in trace.marks()[:MAX_MARKERS]:
        found.append(Marker(event.t, "mark", str(event.data.get("label", "mark"))))
    for event in trace.oom_events():
        oom = oom_of(event)
        label = "out of memory"
        if oom is not None and oom.requested_bytes is not None:
            label += f": tried to allocate {format_bytes(oom.requested_bytes)}"
        found.append(Marker(event.t, "oom", label, oom.device if oom is not None else None))
    oom_times = [m.t for m in found if m.kind == "oom"]
    for event in trace.events(EventKind.EXCEPTION)[:MAX_MARKERS]:
        if any(0 <= event.t - t <= SAME_ERROR_S for t in oom_times):
            continue  # the exception that carried the OOM: one marker is enough
        found.append(Marker(event.t, "exception", str(event.data.get("type", "exception"))))
    end = trace.exit
    if end is not None and end.status not in (0, None):
        found.append(Marker(end.t, "exit", end_words(end.exit_code, end.signal)))
    return sorted(found, key=lambda m: m.t)


def end_words(exit_code: int | None, sig: int | None) -> str:
    """'killed by SIGKILL (signal 9)' or 'exit code 1'."""
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        verb = "killed" if sig == signal.SIGKILL else "ended"
        return f"{verb} by {name} (signal {sig})"
    return f"exit code {exit_code}"


def step_tables(trace: Trace) -> list[StepTable]:
    """Per-step tables of the curves the rules read: framework allocated per GPU, and the
    host memory the program owns (RSS where the trace does not tell file pages apart). The
    growth per step is the one the findings quote (`baseline_trend`)."""
    if not trace.steps():
        return []
    curves = []
    for info in trace.devices():
        curve = step_curve(trace, info.index) if info.index >= 0 else None
        if curve is not None and curve.device == info.index:
            curves.append(curve)
    host = host_curve(trace)
    if host is not None:
        curves.append(host)
    job = job_host_curve(trace) if host is not None and host.pid is not None else None
    if job is not None:
        curves.append(job)  # the training process's own, then its whole job's
    return [_table(trace, curve) for curve in curves]


def _table(trace: Trace, curve: Curve) -> StepTable:
    series = trace.series(curve.metric, curve.device, curve.pid)
    fitted = baseline_trend(trace, curve)
    slope = fitted[0].robust_slope_per_step if fitted is not None else None
    start = series.values[0] if series is not None and series.values else None
    return StepTable(curve.label, curve.metric, curve.device, tuple(curve.steps), slope, start)
