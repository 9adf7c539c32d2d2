"""Facts about host memory: whether a failure was in RAM, which limit applied, what was held."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memdoc.kinds import LimitKind, OomKind
from memdoc.oom.hostcues import HostCues
from memdoc.rules.facts import (
    GPU_FRAMEWORKS,
    Curve,
    Failure,
    device_total,
    framework_at,
    framework_name,
    root_pid,
    step_curve,
)
from memdoc.trace.model import EventKind, Metric, OomInfo
from memdoc.trace.reader import Series, Trace

HOST_KINDS = (OomKind.HOST_KILL, OomKind.HOST_ALLOC, OomKind.SHM, OomKind.DATALOADER_KILLED)
# The seconds before a failure in which the resident memory counts as "at the failure".
RECENT_S = 1.0


# How each kind of limit is called in a word, where the whole label does not fit.
LIMIT_NAMES = {
    LimitKind.RLIMIT_AS: "address-space cap",
    LimitKind.CGROUP: "cgroup limit",
    LimitKind.RAM: "RAM",
}


@dataclass(frozen=True)
class Limit:
    """A ceiling on memory and what sets it: an address-space cap, a cgroup, the machine."""

    label: str
    limit_bytes: float
    kind: str = ""  # a LimitKind: what the limit counts

    @property
    def name(self) -> str:
        """ "cgroup limit", "address-space cap", "RAM"."""
        return LIMIT_NAMES.get(self.kind, self.label)


@dataclass(frozen=True)
class Held:
    """What the program held when it failed, and how that was measured."""

    label: str
    held_bytes: float


def gpu_recorded(trace: Trace) -> bool:
    """True when the trace saw a GPU (the driver, or a framework series on a GPU index)."""
    return any(device.index >= 0 for device in trace.devices())


def on_host(trace: Trace, oom: OomInfo) -> bool:
    """True when the memory that ran out is the host's RAM, not a GPU's.

    An error that says so (a kill, a CPU allocator, `device_type` cpu) is on the host; so is
    any error of a recorded run that saw no GPU at all. A bare error text without either is
    taken to be about a GPU, as most are.
    """
    if oom.kind in HOST_KINDS or oom.framework == "host" or oom.device_type == "cpu":
        return True
    if oom.device_type is not None or trace.is_text_only:
        return False
    return not gpu_recorded(trace) and (oom.device is None or oom.device < 0)


def cpu_only(trace: Trace) -> bool:
    """True when the run used no GPU: the memory that ran out, or every device seen, is host."""
    oom = trace.ending_oom()
    if oom is not None:
        return on_host(trace, oom)
    return not trace.is_text_only and not gpu_recorded(trace)


def no_gpu_seen(trace: Trace) -> bool:
    """A recording that saw no GPU at all: words about a GPU do not belong in it. (An error
    text alone may come from a GPU job even when host memory ran out.)"""
    return not trace.is_text_only and not gpu_recorded(trace)


def host_limits(
    trace: Trace, pid: int | None, at_error: Mapping[str, int] | None = None
) -> list[Limit]:
    """The limits on the host memory of process `pid`, tightest first.

    An address-space cap (RLIMIT_AS) counts mappings, not resident pages, so a process can
    reach it with less resident memory than the cap.
    """
    at_error = at_error or {}
    found: list[Limit] = []
    if pid is not None:
        rlimit = at_error.get("rlimit_as_bytes") or _last(trace, Metric.HOST_RLIMIT_AS, pid)
        if rlimit:
            label = f"address-space cap (RLIMIT_AS) of process {pid}"
            found.append(Limit(label, rlimit, LimitKind.RLIMIT_AS))
    own_cgroup = at_error.get("cgroup_limit_bytes")
    cgroup = _last(trace, Metric.CGROUP_LIMIT, None)
    if own_cgroup and own_cgroup != cgroup:  # the failing process is in a cgroup of its own
        found.append(
            Limit(f"memory limit of the cgroup of process {pid}", own_cgroup, LimitKind.CGROUP)
        )
    elif cgroup:
        found.append(Limit(cgroup_limit_label(trace), cgroup, LimitKind.CGROUP))
    total = machine_memory(trace)
    if total:
        found.append(Limit("host RAM", total, LimitKind.RAM))
    return sorted(found, key=lambda limit: limit.limit_bytes)


def cpu_allocator_said(stats: Mapping[str, object] | None, name: str) -> float | None:
    """A figure the framework gave of its CPU allocator at the error (`limit_bytes`,
    `allocated_bytes`): an OOM event's `stats` are by device, the CPU as -1."""
    cpu = (stats or {}).get("-1")
    value = cpu.get(name) if isinstance(cpu, Mapping) else None
    return float(value) if isinstance(value, int | float) else None


def host_allocator_limit(
    trace: Trace, oom: OomInfo, stats: Mapping[str, object] | None = None
) -> float | None:
    """The limit of a framework's own allocator on the host (ask only of an error on the
    host), where the failed request was that allocator's (TensorFlow's CPU BFC allocator,
    TF_CPU_BFC_MEM_LIMIT_IN_MB): from the error (its allocator dump or message), from what
    the framework said of its CPU allocator at the error, else from its recorded
    configuration."""
    if oom.framework in ("host", "unknown"):
        return None
    own = oom.bfc_limit_bytes or oom.limit_bytes
    if own:
        return float(own)
    if oom.kind != OomKind.ALLOCATOR:
        return None  # killed, or a plain allocation: no allocator of the framework refused
    said = cpu_allocator_said(stats, "limit_bytes")
    if said is not None:
        return said
    for event in trace.events(EventKind.ALLOCATOR_CONFIG):
        limit = event.data.get("cpu_memory_limit_bytes")
        if event.data.get("framework") == oom.framework and isinstance(limit, int | float):
            return float(limit)
    return None


def capacity_at_failure(trace: Trace, fail: Failure) -> float | None:
    """All the memory the failed request could have had: the whole device for a GPU's error;
    on the host, the allocator's own limit when the error names one, else the tightest of
    the failing process's limits. None where the trace does not tell."""
    oom = fail.oom
    if not on_host(trace, oom):
        return device_total(trace, oom.device, oom)
    own = oom.total_bytes or oom.limit_bytes or oom.bfc_limit_bytes
    if own:
        return float(own)
    limits = [] if trace.is_text_only else host_limits(trace, fail.pid, fail.host)
    return limits[0].limit_bytes if limits else None


def shortfall_at_failure(trace: Trace, fail: Failure) -> float | None:
    """How much more the failed request needed than was left under the limit that applied:
    what freeing memory beforehand must have freed for the request to fit. Read where the
    error or the trace tells what was left: a GPU's free bytes (and its pool's unused
    reserve), a CPU allocator's own limit and use, the address space under an address-space
    cap at the error. None elsewhere, and where those figures leave room for the request
    (what was left was not where the request could go: another pool, fragments)."""
    short = _shortfall(trace, fail)
    return short if short is not None and short > 0 else None


def _shortfall(trace: Trace, fail: Failure) -> float | None:
    oom = fail.oom
    requested = oom.requested_bytes
    if not requested:
        return None
    if not on_host(trace, oom):
        if oom.free_bytes is None:
            return None
        return requested - oom.free_bytes - (oom.reserved_unallocated_bytes or 0)
    if oom.bfc_limit_bytes and oom.bfc_in_use_bytes is not None:
        return requested - (oom.bfc_limit_bytes - oom.bfc_in_use_bytes)
    if trace.is_text_only:
        return None
    limits = host_limits(trace, fail.pid, fail.host)
    used = address_space_at_failure(trace, fail)
    if not limits or limits[0].kind != LimitKind.RLIMIT_AS or used is None:
        return None
    return requested - max(limits[0].limit_bytes - used, 0.0)


def address_space_room(trace: Trace, fail: Failure) -> tuple[Limit, float, float] | None:
    """(the failing process's address-space cap, the address space it had in use at the
    error, the room left under the cap), where it had a cap and its address space was
    recorded."""
    limits = host_limits(trace, fail.pid, fail.host)
    cap = next((limit for limit in limits if limit.kind == LimitKind.RLIMIT_AS), None)
    in_use = address_space_at_failure(trace, fail)
    if cap is None or in_use is None:
        return None
    return cap, in_use, max(cap.limit_bytes - in_use, 0.0)


def machine_memory(trace: Trace) -> float | None:
    """The machine's RAM, where the trace recorded it."""
    return _last(trace, Metric.HOST_TOTAL, None)


def job_limit(trace: Trace) -> Limit | None:
    """The tightest limit on the job as a whole: the address-space cap of its first process,
    its cgroup's limit (or one above it), or the machine's RAM."""
    limits = host_limits(trace, root_pid(trace))
    return limits[0] if limits else None


def curve_capacity(trace: Trace, curve: Curve, oom: OomInfo | None) -> float | None:
    """What the curve can grow to: on the host the job's tightest limit, else the device."""
    if curve.on_host:
        limit = job_limit(trace)
        return limit.limit_bytes if limit is not None else None
    return device_total(trace, curve.device, oom)


def cgroup_limit_label(trace: Trace) -> str:
    """ "memory limit of cgroup /job (memory.max)", saying when a cgroup above sets it."""
    said = [e.data for e in trace.events(EventKind.CGROUP) if e.data.get("limit_bytes")]
    if not said:
        return "memory limit of the job's cgroup"
    last = said[-1]
    where, own = str(last.get("limit_cgroup")), str(last.get("path"))
    above = "" if where == own else f", above the job's {own}"
    return f"memory limit of cgroup {where} ({last.get('limit_file')}{above})"


def job_peak_resident(trace: Trace) -> Held | None:
    """The most resident memory the job's own processes held at one time.

    The process tree's resident memory, summed over its live processes at each sample; the
    cgroup's usage instead only when no other program ever shared that cgroup, since a
    shared cgroup (a container, a login session) counts everything in it.
    """
    others = trace.series(Metric.CGROUP_OTHER_PROCESSES)
    own_cgroup = others is not None and len(others) > 0 and max(others.values) == 0
    usage = trace.peak(Metric.CGROUP_USAGE) if own_cgroup else None
    if usage is not None:
        return Held("peak memory of the job's own cgroup", usage[1])
    rss = trace.peak(Metric.HOST_RSS)
    if rss is not None:
        return Held("peak resident memory of the job", rss[1])
    return None


def address_space_at_failure(trace: Trace, fail: Failure) -> float | None:
    """The failing process's address space in use just before the error: what an
    RLIMIT_AS cap counts (recorded only for processes with a cap)."""
    if fail.host.get("address_space_bytes"):
        return fail.host["address_space_bytes"]  # read in-process at the error itself
    if fail.pid is None:
        return None
    series = trace.series(Metric.HOST_VMS, None, fail.pid)
    if series is None:
        return None
    top = series.max_between(fail.t - RECENT_S, fail.t)
    return top if top is not None else series.at(fail.t)


def resident_at_failure(trace: Trace, fail: Failure) -> float | None:
    """Highest resident memory of the failing process (else the job) just before the error."""
    for pid in (fail.pid, None):
        series = trace.series(Metric.HOST_RSS, None, pid)
        if series is None:
            continue
        top = series.max_between(fail.t - RECENT_S, fail.t)
        if top is None:
            top = series.at(fail.t)
        if top:
            return top
    return None


def data_held(trace: Trace, fail: Failure) -> Held | None:
    """What the program's data took when it failed, measured as closely as the trace allows.

    In order: the live arrays the framework listed at the error; the framework's allocated
    bytes on the failing device; on the host, the resident memory the process gained since
    its framework started (which also counts the framework's own caches). None when nothing
    was measured, or nothing held: no request can be weighed against zero bytes.
    """
    held = _data_held(trace, fail)
    return held if held is not None and held.held_bytes > 0 else None


def _data_held(trace: Trace, fail: Failure) -> Held | None:
    if fail.live_array_bytes:
        # JAX no longer lists the arrays donated to the call that failed, though that call
        # still held them: XLA's analysis of it says how much of its output went into them.
        donated = fail.compiled.get("alias", 0)
        if donated:
            label = "live arrays at the error, and the arrays donated to the failing call"
            return Held(label, fail.live_array_bytes + donated)
        return Held("live arrays at the error", fail.live_array_bytes)
    device = fail.oom.device if fail.oom.device is not None else _only_framework_device(trace)
    if device is not None:
        allocated = framework_at(trace, Metric.ALLOCATED, device, fail.t)
        if allocated:
            return Held("allocated by the framework", allocated)
    if trace.is_text_only or not on_host(trace, fail.oom):
        return None
    return _gained_since_start(trace, fail)


def _gained_since_start(trace: Trace, fail: Failure) -> Held | None:
    started = [
        e
        for e in trace.events(EventKind.FRAMEWORK)
        if e.data.get("name") in GPU_FRAMEWORKS and e.pid in (fail.pid, None) and e.t <= fail.t
    ]
    series = trace.series(Metric.HOST_RSS, None, fail.pid)
    now = resident_at_failure(trace, fail)
    if not started or series is None or now is None:
        return None
    before = series.at(started[0].t)
    if before is None:
        return None
    name = framework_name(str(started[0].data.get("name")))
    return Held(f"resident memory gained since {name} started", max(now - before, 1.0))


def _only_framework_device(trace: Trace) -> int | None:
    """The one device framework series name, when there is exactly one."""
    devices = {
        key.device
        for key in trace.series_keys()
        if key.device is not None and key.metric.endswith("." + Metric.ALLOCATED)
    }
    return devices.pop() if len(devices) == 1 else None


def _last(trace: Trace, metric: str, pid: int | None) -> float | None:
    series = trace.series(metric, None, pid)
    last = series.last() if series is not None else None
    return last[1] if last is not None else None


@dataclass(frozen=True)
class Counted:
    """A series measured as a limit counts it, and that limit: like compared with like."""

    series: Series
    limit: Limit


def counted_against_limit(trace: Trace, fail: Failure) -> Counted | None:
    """What ran into the limit that applied to `fail`, as that limit counts it: the failing
    process's address space under its address-space cap; on the host otherwise, the job's
    own memory against its tightest limit; on a GPU, the framework's allocated memory there
    against the device's total."""
    if on_host(trace, fail.oom):
        limits = host_limits(trace, fail.pid, fail.host)
        if not limits:
            return None
        if limits[0].kind == LimitKind.RLIMIT_AS:
            vms = trace.series(Metric.HOST_VMS, None, fail.pid)
            return Counted(vms, limits[0]) if vms is not None else None
        curve = step_curve(trace)
    else:
        curve = step_curve(trace, fail.oom.device)
    if curve is None:
        return None
    series = trace.series(curve.metric, curve.device, curve.pid)
    capacity = curve_capacity(trace, curve, fail.oom)
    if series is None or not capacity:
        return None
    job = job_limit(trace) if curve.on_host else None
    return Counted(series, job or Limit(f"GPU {curve.device} total", capacity, "device"))


def cues_of(fail: Failure) -> HostCues:
    """What the words of the error, the log around it and its code say of the host."""
    return fail.host_cues


def in_data_loading(fail: Failure) -> bool:
    """The failing stack runs through PyTorch's data loading (torch/utils/data)."""
    return fail.stack_cues.data_loading


def in_model_loading(fail: Failure) -> bool:
    """The failing stack runs through a function that loads (`load`, `from_pretrained`)."""
    return fail.stack_cues.loading
