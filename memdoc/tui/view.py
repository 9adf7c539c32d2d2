"""Everything one dashboard frame shows, computed from a source's state: pure, no widgets."""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from memdoc.forecast.summary import forecast_in_force
from memdoc.kinds import LimitKind
from memdoc.rules.facts import root_pid
from memdoc.rules.host import job_limit
from memdoc.trace import Metric, OomInfo, ProcessInfo, Trace
from memdoc.trace.ledger import framework_pids, ledger_at
from memdoc.trace.model import FRAMEWORK_PREFIXES
from memdoc.trace.reader import oom_of
from memdoc.tui.history import ChartData, Window, device_chart, host_chart
from memdoc.tui.ledger import DeviceBar, HostLedger
from memdoc.tui.sources import SourceState
from memdoc.tui.timeline import EventIndex
from memdoc.tui.under_memdoc import FrameworkUse, RecordingRow, framework_use, recording_rows

MAX_PROCESS_ROWS = 64


@dataclass(frozen=True)
class ViewRequest:
    """What the person chose: the device (by index), the chart width and time span."""

    device: int | None = None
    columns: int = 80
    window_s: float | None = 60.0  # None: the whole run


@dataclass(frozen=True)
class DeviceTab:
    index: int
    name: str
    used_fraction: float | None


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    user: str | None
    command: str
    gpu_bytes: int | None
    rss_bytes: int | None
    ours: bool
    # `memdoc top`: a process that runs under memdoc, and what its trace says it holds here.
    recorder_pid: int | None = None
    framework_allocated_bytes: int | None = None
    framework_reserved_bytes: int | None = None

    @property
    def under_memdoc(self) -> bool:
        return self.recorder_pid is not None


@dataclass(frozen=True)
class HostView:
    rss_bytes: int | None  # the run's process tree
    available_bytes: int | None
    total_bytes: int | None
    swap_used_bytes: int | None
    cgroup_usage_bytes: int | None
    cgroup_limit_bytes: int | None
    cgroup_oom_kills: int | None
    # The tightest limit on the run (address-space cap, cgroup or RAM) and what it counts.
    limit_bytes: int | None = None
    limit_kind: str = "ram"
    limit_label: str = ""
    counted_bytes: int | None = None


@dataclass(frozen=True)
class OomView:
    t_s: float
    oom: OomInfo
    handled: bool


@dataclass(frozen=True)
class StatusView:
    kind: str
    label: str
    command: str
    now_t: float
    end_t: float | None = None
    paused: bool = False
    live: bool = False
    ended: bool = False  # not closed, but its writer is gone (see SourceState.ended)
    speed: float | None = None
    step: int | None = None
    phase: str | None = None
    age_s: float | None = None  # since the last record, for a trace still being written
    exit_text: str | None = None
    notes: tuple[str, ...] = ()
    error: str | None = None
    damaged_lines: int = 0


@dataclass(frozen=True)
class DashboardView:
    status: StatusView
    tabs: tuple[DeviceTab, ...] = ()
    device: int | None = None
    ledger: DeviceBar | HostLedger | None = None
    chart: ChartData | None = None
    processes: tuple[ProcessRow, ...] = ()
    host: HostView | None = None
    oom: OomView | None = None
    warnings: tuple[str, ...] = field(default=())
    recordings: tuple[RecordingRow, ...] | None = None  # None: the source does not look
    forecast: str | None = None  # the OOM forecast in force at this instant, in words


def build_view(
    state: SourceState, events: EventIndex, request: ViewRequest, wall_now: float
) -> DashboardView:
    """The frame for `state` at its `now_t`: nothing recorded after that instant is shown."""
    trace = state.trace
    if trace is None:
        return DashboardView(status=_status(state, None, events, wall_now))
    now = state.now_t
    devices = trace.devices()
    bars = {d.index: DeviceBar.of(ledger_at(trace, d.index, now)) for d in devices}
    tabs = tuple(
        DeviceTab(d.index, _short_name(d.name), bars[d.index].used_fraction) for d in devices
    )
    indexes = [d.index for d in devices]
    device = request.device if request.device in indexes else (indexes[0] if indexes else None)
    window = _window(now, request)
    host = host_at(trace, now)
    ledger: DeviceBar | HostLedger
    if device is None:
        chart = host_chart(trace, events, window, host.limit_bytes)
        ledger = HostLedger(
            host.total_bytes,
            host.available_bytes,
            host.rss_bytes,
            host.limit_bytes if host.limit_kind != "ram" else None,
            host.limit_kind,
            host.counted_bytes,
        )
    else:
        chart = device_chart(trace, events, device, window)
        ledger = bars[device]
    live = state.recordings
    use = framework_use(live, devices, device) if live else {}
    return DashboardView(
        status=_status(state, trace, events, wall_now),
        tabs=tabs,
        device=device,
        ledger=ledger,
        chart=chart,
        processes=process_rows(trace, device, now, use),
        host=host,
        oom=_oom(events, now, survived=_exited_zero_by(trace, now)),
        warnings=tuple(trace.warnings),
        recordings=None if live is None else recording_rows(live, wall_now),
        # A forecast counts from the instant it was made: not for a run that is over.
        forecast=None if state.ended else forecast_in_force(trace, now),
    )


def _window(now: float, request: ViewRequest) -> Window:
    columns = max(1, request.columns)
    if request.window_s is None:
        return Window(0.0, max(now, 1.0), columns)
    # Columns on a fixed grid of time: as time moves on, columns shift whole and keep their
    # values, so the chart redraws only what is new.
    column_s = request.window_s / columns
    t1 = math.ceil(now / column_s) * column_s
    return Window(t1 - request.window_s, t1, columns, end_s=now)


def process_rows(
    trace: Trace, device: int | None, t: float, use: Mapping[int, FrameworkUse] | None = None
) -> tuple[ProcessRow, ...]:
    """Processes on `device` (every process of the run when there is no device), ours first.

    `use`: processes that run under memdoc, from their own traces (`memdoc top`); those with
    framework memory on the device are listed even when the driver does not show them.
    """
    use = use or {}
    gpu: dict[int, int | None] = {}
    if device is not None:
        for series in trace.series_for(Metric.GPU_PROC_USED, device=device):
            value = series.at(t)
            if series.key.pid is not None and value is not None:
                gpu[series.key.pid] = int(value)
    ours = {p.pid: p for p in trace.processes(ours=True) if p.t <= t}
    on_device = framework_pids(trace, device) if device is not None else set(ours)
    for pid in on_device & set(ours):
        gpu.setdefault(pid, None)
    for pid, fw in use.items():
        if fw.allocated_bytes is not None or fw.reserved_bytes is not None:
            gpu.setdefault(pid, None)
    known = {p.pid: p for p in trace.processes()}
    rows = [
        _process_row(
            trace, t, pid, gpu_bytes=used, info=known.get(pid), ours=pid in ours, fw=use.get(pid)
        )
        for pid, used in gpu.items()
    ]
    rows.sort(key=lambda r: (not r.ours, not r.under_memdoc, -(r.gpu_bytes or 0), r.pid))
    return tuple(rows[:MAX_PROCESS_ROWS])


def _process_row(
    trace: Trace,
    t: float,
    pid: int,
    *,
    gpu_bytes: int | None,
    info: ProcessInfo | None,
    ours: bool,
    fw: FrameworkUse | None,
) -> ProcessRow:
    if info is None and fw is not None:
        info = fw.process
    rss = trace.series(Metric.HOST_RSS, pid=pid)
    rss_value = rss.at(t) if rss is not None else None
    return ProcessRow(
        pid=pid,
        user=info.user if info else None,
        command=" ".join(info.command) if info and info.command else "?",
        gpu_bytes=gpu_bytes,
        rss_bytes=int(rss_value) if rss_value is not None else None,
        ours=ours,
        recorder_pid=fw.recorder_pid if fw else None,
        framework_allocated_bytes=fw.allocated_bytes if fw else None,
        framework_reserved_bytes=fw.reserved_bytes if fw else None,
    )


def host_at(trace: Trace, t: float) -> HostView:
    def value(metric: str) -> int | None:
        series = trace.series(metric)
        v = series.at(t) if series is not None else None
        return int(v) if v is not None else None

    limit = job_limit(trace)
    counted = None
    if limit is not None and limit.kind == LimitKind.CGROUP:
        counted = value(Metric.CGROUP_USAGE)
    elif limit is not None and limit.kind == LimitKind.RLIMIT_AS:
        vms = trace.series(Metric.HOST_VMS, pid=root_pid(trace))
        at = vms.at(t) if vms is not None else None
        counted = int(at) if at is not None else None
    return HostView(
        limit_bytes=int(limit.limit_bytes) if limit is not None else None,
        limit_kind=limit.kind if limit is not None else LimitKind.RAM,
        limit_label=limit.label if limit is not None else "",
        counted_bytes=counted,
        rss_bytes=value(Metric.HOST_RSS),
        available_bytes=value(Metric.HOST_AVAILABLE),
        total_bytes=value(Metric.HOST_TOTAL),
        swap_used_bytes=value(Metric.HOST_SWAP_USED),
        cgroup_usage_bytes=value(Metric.CGROUP_USAGE),
        cgroup_limit_bytes=value(Metric.CGROUP_LIMIT),
        cgroup_oom_kills=value(Metric.CGROUP_OOM_KILLS),
    )


def _oom(events: EventIndex, t: float, *, survived: bool = False) -> OomView | None:
    """The last OOM up to `t`; caught when the program said so, or exited 0 since."""
    for event in reversed(events.ooms_until(t)):
        oom = oom_of(event)
        if oom is not None:
            return OomView(event.t, oom, survived or bool(event.data.get("handled", False)))
    return None


def _exited_zero_by(trace: Trace, t: float) -> bool:
    """The program had exited 0 by `t`: every OOM before was caught and survived."""
    end = trace.exit
    return end is not None and end.status == 0 and end.t <= t


def _status(
    state: SourceState, trace: Trace | None, events: EventIndex, wall_now: float
) -> StatusView:
    if trace is None:
        return StatusView(
            kind=state.kind,
            label=state.label,
            command="",
            now_t=0.0,
            live=state.live,
            notes=state.notes,
            error=state.error,
        )
    now = state.now_t
    mark = events.mark_at(now)
    silent = state.live or state.ended
    age = wall_now - (trace.header.created_unix + trace.last_t) if silent else None
    return StatusView(
        kind=state.kind,
        label=state.label,
        command=" ".join(trace.header.command),
        now_t=now,
        end_t=state.end_t,
        paused=state.paused,
        live=state.live,
        ended=state.ended,
        speed=state.speed,
        step=events.step_at(now),
        phase=str(mark.data.get("label")) if mark is not None else None,
        age_s=max(0.0, age) if age is not None else None,
        exit_text=_exit_text(trace, now),
        notes=_notes(state, trace, events),
        error=state.error,
        damaged_lines=state.damaged_lines,
    )


def _notes(state: SourceState, trace: Trace, events: EventIndex) -> tuple[str, ...]:
    """What cannot be seen and why; not the frameworks the program never imported."""
    notes = list(state.notes)
    for status in trace.unavailable_collectors():
        if status.name in FRAMEWORK_PREFIXES and status.name not in events.frameworks:
            continue
        text = status.reason or f"{status.name} is not available"
        if text not in notes:
            notes.append(text)
    return tuple(notes)


def _exit_text(trace: Trace, t: float) -> str | None:
    end = trace.exit
    if end is None or end.t > t:
        return None
    if end.signal is not None:
        try:
            name = signal.Signals(end.signal).name
        except ValueError:
            name = f"signal {end.signal}"
        return f"killed by {name}"
    if end.exit_code is not None:
        return f"exit code {end.exit_code}"
    return "ended"


def _short_name(name: str) -> str:
    return name.removeprefix("NVIDIA ").removeprefix("GeForce ")
