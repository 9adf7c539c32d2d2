"""What a scrape shows: the ledgers, processes, host memory, steps and OOMs of a trace now."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.forecast.model import Forecast
from memdoc.rules.base import Finding
from memdoc.rules.spec import confidence_word
from memdoc.trace.ledger import (
    ALLOCATED,
    CACHED_FREE,
    PROCESS_OTHER,
    RESERVED,
    Ledger,
    Readings,
    build_ledger,
    ledger_at,
    run_pids,
)
from memdoc.trace.model import FRAMEWORK_PREFIXES, EventKind, Metric, framework_metric
from memdoc.trace.reader import Trace

# A process's series whose last value is older than this (behind the trace's newest value)
# belongs to a process that is gone: NVML process lists are read every few seconds.
STALE_AFTER_S = 30.0
# Step rate: steps over this last stretch of the run.
STEP_RATE_WINDOW_S = 60.0
# The terms of one process's own ledger (the device-wide terms make no sense per process).
PROCESS_TERMS = (ALLOCATED, CACHED_FREE, RESERVED, PROCESS_OTHER)


@dataclass(frozen=True)
class ProcessMemory:
    """One process on one device: its driver figure and its own ledger terms."""

    device: int
    pid: int
    rank: int | None
    local_rank: int | None
    ours: bool
    gpu_used_bytes: int | None  # the driver's (NVML) per-process figure
    ledger: Ledger


@dataclass(frozen=True)
class TopFinding:
    """The most confident finding: what the info metric carries."""

    rule: str
    code: str
    confidence: float
    word: str
    title: str


@dataclass(frozen=True)
class ForecastNow:
    """The OOM forecast in force, counted from now: what the forecast metrics carry."""

    limit: str  # which limit, in words: "address-space cap (RLIMIT_AS)", "GPU 0 total"
    limit_bytes: int
    device: int | None
    steps_left: int
    seconds_left: float | None  # None when the steps' pace is unknown


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one scrape exposes, computed from the trace as it stands."""

    t: float
    running: bool
    devices: tuple[Ledger, ...]
    processes: tuple[ProcessMemory, ...]
    host_rss_bytes: int | None
    host_process_rss_bytes: tuple[tuple[int, int], ...]  # (pid, bytes) per process
    host_limits_bytes: tuple[tuple[str, int], ...]  # (kind, bytes): cgroup, ram, rlimit_as
    host_available_bytes: int | None
    steps: int
    step_rate_per_s: float | None
    ooms: int
    top_finding: TopFinding | None
    forecast: ForecastNow | None = None


def snapshot_of(trace: Trace, findings: Sequence[Finding] = ()) -> MetricsSnapshot:
    """The trace at its newest instant, through the same ledger function as the dashboard
    and the report."""
    now = trace.last_t
    devices = tuple(ledger_at(trace, d.index, now) for d in trace.devices())
    return MetricsSnapshot(
        t=now,
        running=not trace.complete,
        devices=devices,
        processes=tuple(_processes(trace, now)),
        host_rss_bytes=_last_int(trace, Metric.HOST_RSS),
        host_process_rss_bytes=tuple(_process_rss(trace, now)),
        host_limits_bytes=tuple(_host_limits(trace)),
        host_available_bytes=_last_int(trace, Metric.HOST_AVAILABLE),
        steps=len(trace.steps()),
        step_rate_per_s=step_rate_per_s(trace, now),
        ooms=len(trace.oom_events()),
        top_finding=_top(findings),
        forecast=forecast_now(trace, now),
    )


def forecast_now(trace: Trace, now: float) -> ForecastNow | None:
    """The forecast the run's last `forecast` event made, counted from `now`; None when it
    forecast no OOM (or cleared one), and once the run ended: nothing lies ahead of it."""
    if trace.complete:
        return None
    said = _last_forecast(trace)
    if said is None:
        return None
    last = _last_step_number(trace)
    step = said.step if last is None else max(said.step, last)
    seconds = None if said.eta_s is None else max(said.eta_s - (now - said.t_s), 0.0)
    return ForecastNow(
        limit=said.limit_label,
        limit_bytes=said.limit_bytes,
        device=said.device,
        steps_left=max(said.oom_step - step, 0),
        seconds_left=seconds,
    )


def _last_forecast(trace: Trace) -> Forecast | None:
    events = trace.events(EventKind.FORECAST)
    if not events or events[-1].data.get("state") != "likely":
        return None
    return Forecast.from_data(events[-1].data)


def _last_step_number(trace: Trace) -> int | None:
    """The number of the last step that has one (reads from the end: a run has millions)."""
    for event in reversed(trace.steps()):
        number = event.data.get("step")
        if isinstance(number, int):
            return number
    return None


def step_rate_per_s(trace: Trace, now: float, window_s: float = STEP_RATE_WINDOW_S) -> float | None:
    """Steps per second over the last `window_s`: None before two steps, 0 when they stopped."""
    steps = trace.steps()
    if len(steps) < 2:
        return None
    recent = [t for t in steps.times() if t >= now - window_s]
    if len(recent) < 2:
        return 0.0
    return (len(recent) - 1) / max(recent[-1] - recent[0], 1e-9)


def _processes(trace: Trace, now: float) -> list[ProcessMemory]:
    info = {p.pid: p for p in trace.processes()}
    out: list[ProcessMemory] = []
    for device, pids in sorted(_pids_by_device(trace, now).items()):
        ours = run_pids(trace, device)
        for pid in sorted(pids):
            readings = _process_readings(trace, device, pid, now)
            process = info.get(pid)
            out.append(
                ProcessMemory(
                    device=device,
                    pid=pid,
                    rank=process.rank if process else None,
                    local_rank=process.local_rank if process else None,
                    ours=pid in ours,
                    gpu_used_bytes=readings.this_process_bytes,
                    ledger=build_ledger(device, "now", now, readings),
                )
            )
    return out


def _pids_by_device(trace: Trace, now: float) -> dict[int, set[int]]:
    """Processes with a recent value per device: the driver's figure or framework counters."""
    found: dict[int, set[int]] = {}
    for key in trace.series_keys():
        if key.device is None or key.pid is None:
            continue
        series = trace.series(key.metric, key.device, key.pid)
        last = series.last() if series is not None else None
        if last is not None and now - last[0] <= STALE_AFTER_S:
            found.setdefault(key.device, set()).add(key.pid)
    return found


def _process_readings(trace: Trace, device: int, pid: int, now: float) -> Readings:
    """One process's own layers on a device: framework pools and the driver's figure."""
    allocated: dict[str, int] = {}
    reserved: dict[str, int] = {}
    for fw in FRAMEWORK_PREFIXES:
        for quantity, into in ((Metric.ALLOCATED, allocated), (Metric.RESERVED, reserved)):
            series = trace.series(framework_metric(fw, quantity), device, pid)
            value = series.at(now) if series is not None else None
            if value is not None:
                into[fw] = int(value)
    used = trace.series(Metric.GPU_PROC_USED, device, pid)
    used_value = used.at(now) if used is not None else None
    return Readings(
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        this_process_bytes=None if used_value is None else int(used_value),
    )


def _process_rss(trace: Trace, now: float) -> list[tuple[int, int]]:
    out = []
    for key in trace.series_keys():
        if key.metric != Metric.HOST_RSS or key.pid is None:
            continue
        series = trace.series(key.metric, None, key.pid)
        last = series.last() if series is not None else None
        if last is not None and now - last[0] <= STALE_AFTER_S:
            out.append((key.pid, int(last[1])))
    return sorted(out)


def _host_limits(trace: Trace) -> list[tuple[str, int]]:
    limits = [
        ("cgroup", _last_int(trace, Metric.CGROUP_LIMIT)),
        ("ram", _last_int(trace, Metric.HOST_TOTAL)),
    ]
    caps = [
        int(last[1])
        for key in trace.series_keys()
        if key.metric == Metric.HOST_RLIMIT_AS
        and (series := trace.series(key.metric, key.device, key.pid)) is not None
        and (last := series.last()) is not None
    ]
    if caps:
        limits.append(("rlimit_as", min(caps)))
    return [(kind, value) for kind, value in limits if value is not None]


def _last_int(trace: Trace, metric: str) -> int | None:
    series = trace.series(metric)
    last = series.last() if series is not None else None
    return None if last is None else int(last[1])


def _top(findings: Sequence[Finding]) -> TopFinding | None:
    if not findings:
        return None
    best = max(findings, key=lambda f: f.confidence)
    return TopFinding(
        best.rule, best.code, best.confidence, confidence_word(best.confidence), best.title
    )
