"""What happened in a run: command, machine, devices, frameworks, peaks, and how it ended."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from memdoc.kinds import LimitKind
from memdoc.report.ledger import held_series, oom_device
from memdoc.report.timeline import end_words
from memdoc.rules.facts import framework_name, root_pid
from memdoc.rules.host import host_limits, job_limit
from memdoc.trace import EventKind, Metric, OomInfo, Trace
from memdoc.trace.model import FRAMEWORK_PREFIXES, RAISED_OUT_OF_WATCH
from memdoc.trace.reader import oom_of
from memdoc.units import format_bytes, format_duration


@dataclass(frozen=True)
class Ending:
    """How the run ended, in a word (`kind`) and a sentence; `bad` ones are shown in red."""

    kind: str  # ok, oom, host-oom, killed, signal, error, incomplete, imported
    text: str
    bad: bool
    t: float | None = None


@dataclass(frozen=True)
class GpuRow:
    """One GPU: what it is, and the most this run held on it."""

    index: int
    name: str
    total_bytes: int | None
    peak_held_bytes: int | None  # framework pools (peak-preserving), else the driver's figure
    peak_used_bytes: int | None  # the whole device, every process (driver)


@dataclass(frozen=True)
class Overview:
    command: str
    host: str | None
    pid: int | None
    python: str | None
    memdoc_version: str
    mode: str
    started_unix: float
    duration_s: float
    rank: int | None
    world_size: int | None
    gpus: tuple[GpuRow, ...]
    frameworks: tuple[tuple[str, str | None], ...]  # (name, version)
    ending: Ending
    host_peak_rss_bytes: int | None
    host_total_bytes: int | None
    cgroup_limit_bytes: int | None
    steps: int
    env: tuple[tuple[str, str], ...]
    unavailable: tuple[tuple[str, str, str | None], ...]  # (collector, reason, hint)
    trace_path: str | None
    # The tightest limit on the run's host memory (address-space cap, cgroup or RAM).
    host_limit_bytes: int | None = None
    host_limit_name: str = ""


# Fewer steps than this and growth across steps cannot be judged (the leak rule's minimum).
STEPS_TO_JUDGE = 5


def steps_words(overview: Overview) -> str:
    """The step count, and whether it was enough to judge growth across steps: "128",
    "3 (too few to judge growth across steps)", "none reported (...)" for a recorded run
    whose loop reported none; for what memdoc did not record itself (an imported file, an
    error text) the count alone, when there is one."""
    if overview.mode not in ("run", "watch"):
        return str(overview.steps) if overview.steps else ""
    if overview.steps >= STEPS_TO_JUDGE:
        return str(overview.steps)
    count = str(overview.steps) if overview.steps else "none reported"
    return f"{count} (too few to judge growth across steps)"


def ending_of(trace: Trace) -> Ending:
    """The run's end in words: an OOM or a kill first, then the exit status. A run that
    exited 0 survived every OOM it recorded: the program caught them."""
    event = trace.ending_oom_event()
    oom = oom_of(event) if event is not None else None
    end = trace.exit
    survived = event is not None and end is not None and end.status == 0
    if event is not None and oom is not None and not survived:
        host = event.data.get("host")
        at_error = host if isinstance(host, dict) else None
        stats = event.data.get("stats")
        said = _oom_words(
            trace, oom, event.pid, at_error, stats if isinstance(stats, dict) else None
        )
        return Ending(*said, bad=True, t=event.t)
    if end is None:
        if trace.header.mode == "import":
            return Ending("imported", "Imported from another tool's files: no end recorded", False)
        if trace.is_text_only:
            return Ending("incomplete", "only an error text: nothing was recorded over time", False)
        return Ending(
            "incomplete",
            "The trace has no end record: memdoc or the machine stopped before the program ended",
            bad=True,
            t=trace.duration_s,
        )
    at = f" after {format_duration(end.t)}"
    if end.signal is not None:
        kind = "killed" if end.signal == 9 else "signal"
        words = end_words(None, end.signal)
        return Ending(kind, f"{words[0].upper()}{words[1:]}{at}", True, end.t)
    if end.reason == RAISED_OUT_OF_WATCH:
        return Ending(
            "raised", f"{_watch_error(trace)} raised out of the watched block{at}", True, end.t
        )
    if end.exit_code not in (0, None):
        return Ending(
            "error", f"Failed with exit code {end.exit_code}{_last_error(trace)}{at}", True, end.t
        )
    if survived:
        count = _distinct_ooms(trace)
        ooms = "1 OOM" if count == 1 else f"{count} OOMs"
        return Ending("ok", f"{ooms} caught and survived; the run exited 0{at}", False, end.t)
    return Ending("ok", f"Finished normally{at}", False, end.t)


def _distinct_ooms(trace: Trace) -> int:
    """How many OOMs the run had: those recorded in-process, when there are any, since
    the allocator dumps read from stderr then only add detail to them."""
    events = [e for e in trace.oom_events() if oom_of(e) is not None]
    in_process = [e for e in events if e.data.get("source") != "stderr"]
    return len(in_process or events)


def _oom_words(
    trace: Trace,
    oom: OomInfo,
    pid: int | None,
    at_error: dict[str, int] | None = None,
    stats: dict[str, object] | None = None,
) -> tuple[str, str]:
    from memdoc.rules.host import on_host

    rank = _rank_of(trace, pid)
    who = f"Rank {rank} ran" if rank is not None else "Ran"
    if on_host(trace, oom):
        own = _own_allocator_limit(trace, oom, stats)
        if own is not None:
            # TensorFlow's BFC allocator on the CPU stops at its own limit, below the RAM.
            return "host-oom", f"{who} out of {own}"
        return "host-oom", f"{who} out of host memory{_under_limit(trace, pid, at_error)}"
    device = oom_device(trace, oom)
    where = f" on GPU {device}" if device is not None else ""
    return "oom", f"{who} out of GPU memory{where}"


def _under_limit(trace: Trace, pid: int | None, at_error: dict[str, int] | None) -> str:
    """ " (RAM)", or the tighter limit that applied: " under its 1.5 GiB address-space cap".
    What the failing process read of its own limits at the error counts first: a cap set just
    before the failure may not have been sampled yet."""
    limits = host_limits(trace, pid if pid is not None else root_pid(trace), at_error)
    if not limits or limits[0].kind == LimitKind.RAM:
        return " (RAM)"
    return f" under its {format_bytes(limits[0].limit_bytes)} {limits[0].name}"


def _own_allocator_limit(trace: Trace, oom: OomInfo, stats: dict[str, object] | None) -> str | None:
    """ "TensorFlow's 512 MiB CPU allocator limit" when a framework's allocator on the host
    has a limit of its own below the job's, which is then what ran out."""
    from memdoc.rules.host import host_allocator_limit

    own = host_allocator_limit(trace, oom, stats)
    job = job_limit(trace)
    if not own or (job and own >= job.limit_bytes):
        return None
    return f"{framework_name(oom.framework)}'s {format_bytes(own)} CPU allocator limit"


def _rank_of(trace: Trace, pid: int | None) -> int | None:
    """The rank of the process that failed, else the rank the whole trace records."""
    for process in trace.processes():
        if pid is not None and process.pid == pid and process.rank is not None:
            return process.rank
    return trace.rank


def not_recorded(trace: Trace) -> tuple[tuple[str, str, str | None], ...]:
    """(collector, reason, hint) for what no process could record: the same reason from
    several processes once, with their number; nothing for a collector that worked in one."""
    last = {(s.name, s.pid): s for s in trace.collectors()}
    worked = {s.name for s in last.values() if s.available}
    counts: dict[tuple[str, str, str | None], int] = {}
    for status in last.values():
        if not status.available and status.name not in worked:
            key = (status.name, status.reason or "not available", status.hint)
            counts[key] = counts.get(key, 0) + 1
    return tuple(
        (name, reason if n == 1 else f"{reason} (in {n} processes)", hint)
        for (name, reason, hint), n in counts.items()
    )


def _watch_error(trace: Trace) -> str:
    errors = [e for e in trace.events(EventKind.EXCEPTION) if e.data.get("where") == "watch"]
    name = str(errors[-1].data.get("type", "")) if errors else ""
    return name.removeprefix("builtins.") or "An exception"


def _last_error(trace: Trace) -> str:
    """The exception that ended the program: one its own process raised, not a child's (a
    shell script whose Python child failed ended with the script's own code)."""
    root = root_pid(trace)
    errors = [e for e in trace.events(EventKind.EXCEPTION) if root is None or e.pid in (root, None)]
    if not errors:
        return ""
    return f" (uncaught {errors[-1].data.get('type', 'exception')})"


def gpu_rows(trace: Trace) -> list[GpuRow]:
    rows: list[GpuRow] = []
    for info in trace.devices():
        if info.index < 0:
            continue
        used = trace.peak(Metric.GPU_USED, info.index)
        rows.append(
            GpuRow(
                index=info.index,
                name=info.name,
                total_bytes=trace.device_total_bytes(info.index),
                peak_held_bytes=peak_held_bytes(trace, info.index),
                peak_used_bytes=int(used[1]) if used is not None else None,
            )
        )
    return rows


def peak_held_bytes(trace: Trace, device: int) -> int | None:
    """The most this run held on a device: pool peaks count, so spikes between samples do too."""
    candidates: list[float] = []
    series = held_series(trace, device)
    if series is not None and (best := series.max()) is not None:
        candidates.append(best[1])
    for prefix in FRAMEWORK_PREFIXES.values():
        for peaks in trace.series_for(f"{prefix}.{Metric.RESERVED_PEAK}", device=device):
            if (best := peaks.max()) is not None:
                candidates.append(best[1])
    return int(max(candidates)) if candidates else None


def _framework_versions(trace: Trace) -> tuple[tuple[str, str | None], ...]:
    versions: dict[str, str | None] = {}
    for event in trace.events(EventKind.FRAMEWORK):
        name = str(event.data.get("name", ""))
        version = event.data.get("version")
        if name and versions.get(name) is None:
            versions[name] = str(version) if version is not None else None
    for name in trace.frameworks():
        versions.setdefault(name, None)
    return tuple(versions.items())


def _last_value(trace: Trace, metric: str) -> int | None:
    series = trace.series(metric)
    last = series.last() if series is not None else None
    return int(last[1]) if last is not None else None


def build_overview(trace: Trace) -> Overview:
    header = trace.header
    rss = trace.peak(Metric.HOST_RSS)
    limit = job_limit(trace)
    return Overview(
        command=shlex.join(header.command) if header.command else "",
        host=header.host,
        pid=header.pid,
        python=header.python,
        memdoc_version=header.memdoc_version,
        mode=header.mode,
        started_unix=header.created_unix,
        duration_s=trace.duration_s,
        rank=header.rank,
        world_size=header.world_size,
        gpus=tuple(gpu_rows(trace)),
        frameworks=_framework_versions(trace),
        ending=ending_of(trace),
        host_peak_rss_bytes=int(rss[1]) if rss is not None else None,
        host_total_bytes=_last_value(trace, Metric.HOST_TOTAL),
        cgroup_limit_bytes=_last_value(trace, Metric.CGROUP_LIMIT),
        steps=len(trace.steps()),
        env=tuple(sorted(header.env.items())),
        unavailable=not_recorded(trace),
        trace_path=str(trace.path) if trace.path is not None else None,
        host_limit_bytes=int(limit.limit_bytes) if limit is not None else None,
        host_limit_name=limit.name if limit is not None else "",
    )
