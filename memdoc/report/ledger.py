"""The per-device memory ledger: where a device's memory went at its peak and at the OOM."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from memdoc.trace import Metric, OomInfo, Series, Trace
from memdoc.trace.reader import sum_series
from memdoc.units import format_bytes

# Term keys, in the order a bar stacks them (left to right).
ALLOCATED = "allocated"
CACHED_FREE = "cached_free"
RESERVED = "reserved"  # a pool whose allocated part is unknown
PROCESS_OTHER = "process_other"
OTHER_PROCESSES = "other_processes"
FREE = "free"
UNEXPLAINED = "unexplained"

FRAMEWORK_NAMES = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX"}
# Frameworks that take most of the device up front unless told otherwise (DESIGN §2).
_PREALLOCATION_NOTES = {
    "tensorflow": "TensorFlow maps nearly all device memory at start unless memory growth is "
    "on: a big 'cached but free' share is its pool, not a leak.",
    "jax": "JAX/XLA takes 75% of the device at first use unless "
    "XLA_PYTHON_CLIENT_PREALLOCATE=false: a big 'cached but free' share is its pool.",
}


@dataclass(frozen=True)
class Readings:
    """What was known about one device at one instant; None means not measured."""

    total_bytes: int | None = None
    free_bytes: int | None = None
    used_bytes: int | None = None  # driver (NVML) view of the whole device
    allocated_bytes: Mapping[str, int] = field(default_factory=dict)  # per framework
    reserved_bytes: Mapping[str, int] = field(default_factory=dict)  # per framework
    this_process_bytes: int | None = None  # driver's per-process figure, our processes summed
    other_processes_bytes: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LedgerTerm:
    """One slice of the device: a key from the list above, a label for people, and bytes."""

    key: str
    label: str
    bytes: int
    framework: str | None = None


@dataclass(frozen=True)
class Ledger:
    """Where one device's memory went at one moment.

    When the device total is known the terms add up to it exactly: whatever the measured
    terms do not cover is the `unexplained` term, shown and never hidden. Terms that could
    not be measured are named in `unknown` (their bytes sit in the remainder).
    """

    device: int
    moment: str  # "peak" or "oom"
    t: float | None
    total_bytes: int | None
    terms: tuple[LedgerTerm, ...]
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    source: str = "samples"  # or "oom message"

    @property
    def accounted_bytes(self) -> int:
        return sum(term.bytes for term in self.terms)

    def term(self, key: str) -> int | None:
        """Bytes of all terms with this key, None when there is none."""
        found = [t.bytes for t in self.terms if t.key == key]
        return sum(found) if found else None


def build_ledger(
    device: int, moment: str, t: float | None, readings: Readings, *, source: str = "samples"
) -> Ledger:
    """Turn readings into ledger terms that add up to the device total when it is known."""
    terms: list[LedgerTerm] = []
    unknown: list[str] = []
    notes = list(readings.notes)
    pool_bytes = _framework_terms(readings, terms)
    if readings.this_process_bytes is not None:
        rest = readings.this_process_bytes - pool_bytes
        if rest < 0:
            notes.append(
                "the driver's per-process figure is older than the framework counters "
                f"(it reads {format_bytes(-rest)} less); counted as 0"
            )
        terms.append(LedgerTerm(PROCESS_OTHER, "context + other allocators", max(rest, 0)))
    else:
        unknown.append("CUDA context and other allocators of this process")
    if readings.other_processes_bytes is not None:
        terms.append(LedgerTerm(OTHER_PROCESSES, "other processes", readings.other_processes_bytes))
    else:
        unknown.append("other processes")
    free = readings.free_bytes
    if free is None and readings.total_bytes is not None and readings.used_bytes is not None:
        free = readings.total_bytes - readings.used_bytes
    if free is not None:
        terms.append(LedgerTerm(FREE, "free", free))
    else:
        unknown.append("free")
    if readings.total_bytes is not None:
        remainder = readings.total_bytes - sum(term.bytes for term in terms)
        if remainder < 0:
            notes.append(
                f"the measured terms exceed the device total by {format_bytes(-remainder)}: "
                "they were read at slightly different instants"
            )
        terms.append(LedgerTerm(UNEXPLAINED, "unexplained remainder", remainder))
    else:
        notes.append("device total unknown: the terms shown are all that was measured")
    notes.extend(_preallocation_notes(readings))
    return Ledger(
        device=device,
        moment=moment,
        t=t,
        total_bytes=readings.total_bytes,
        terms=tuple(terms),
        unknown=tuple(unknown),
        notes=tuple(notes),
        source=source,
    )


def _framework_terms(readings: Readings, terms: list[LedgerTerm]) -> int:
    """Append allocated / cached-but-free terms per framework; return the pools' total."""
    pool_bytes = 0
    frameworks = list(dict.fromkeys([*readings.allocated_bytes, *readings.reserved_bytes]))
    for fw in frameworks:
        name = FRAMEWORK_NAMES.get(fw, fw)
        allocated = readings.allocated_bytes.get(fw)
        reserved = readings.reserved_bytes.get(fw)
        if allocated is not None:
            terms.append(LedgerTerm(ALLOCATED, f"{name} allocated", allocated, fw))
        if reserved is not None and allocated is not None:
            cached = max(reserved - allocated, 0)
            terms.append(LedgerTerm(CACHED_FREE, f"{name} cached but free", cached, fw))
        elif reserved is not None:
            terms.append(LedgerTerm(RESERVED, f"{name} pool (split unknown)", reserved, fw))
        pool_bytes += max(reserved or 0, allocated or 0)
    return pool_bytes


def _preallocation_notes(readings: Readings) -> list[str]:
    total = readings.total_bytes
    if not total:
        return []
    return [
        note
        for fw, note in _PREALLOCATION_NOTES.items()
        if readings.reserved_bytes.get(fw, 0) >= 0.5 * total
    ]


# -- readings from a trace ----------------------------------------------------------------


def nearest(series: Series | None, t: float) -> float | None:
    """The value recorded nearest to `t`, before or after (for rarely sampled series)."""
    if series is None or not series.values:
        return None
    i = bisect.bisect_left(series.times, t)
    if i == 0:
        return series.values[0]
    if i == len(series.times):
        return series.values[-1]
    before, after = series.times[i - 1], series.times[i]
    return series.values[i] if after - t < t - before else series.values[i - 1]


def our_pids(trace: Trace, device: int) -> set[int]:
    """Processes of this run: recorded as ours, the trace's own, or reporting framework counters."""
    pids = trace.our_pids()
    if trace.header.pid is not None:
        pids.add(trace.header.pid)
    for key in trace.series_keys():
        if key.device == device and key.pid is not None and not key.metric.startswith("gpu."):
            pids.add(key.pid)
    return pids


def readings_at(trace: Trace, device: int, t: float) -> Readings:
    """Every layer of one device as recorded at (or, for slow series, nearest to) `t`."""
    allocated = _framework_at(trace, Metric.ALLOCATED, device, t)
    reserved = _framework_at(trace, Metric.RESERVED, device, t)
    free = nearest(trace.series(Metric.GPU_FREE, device), t)
    used = nearest(trace.series(Metric.GPU_USED, device), t)
    this_process: int | None = None
    others: int | None = None
    per_process = trace.series_for(Metric.GPU_PROC_USED, device=device)
    if per_process:
        ours = our_pids(trace, device)
        values = {s.key.pid: nearest(s, t) for s in per_process}
        this_process = int(sum(v for pid, v in values.items() if pid in ours and v is not None))
        others = int(sum(v for pid, v in values.items() if pid not in ours and v is not None))
    return Readings(
        total_bytes=trace.device_total_bytes(device),
        free_bytes=None if free is None else int(free),
        used_bytes=None if used is None else int(used),
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        this_process_bytes=this_process,
        other_processes_bytes=others,
    )


def _framework_at(trace: Trace, quantity: str, device: int, t: float) -> dict[str, int]:
    out: dict[str, int] = {}
    for fw, series in trace.framework_series(quantity, device).items():
        value = series.at(t)
        if value is None:
            value = nearest(series, t)
        if value is not None:
            out[fw] = int(value)
    return out


def readings_from_oom(oom: OomInfo, sampled: Readings) -> Readings:
    """The error message's numbers (exact at the failure), completed by the samples."""
    fw = oom.framework if oom.framework in FRAMEWORK_NAMES else None
    allocated = dict(sampled.allocated_bytes)
    reserved = dict(sampled.reserved_bytes)
    if fw is not None and oom.allocated_bytes is not None:
        allocated[fw] = oom.allocated_bytes
        message_reserved = _message_reserved(oom)
        if message_reserved is not None:
            reserved[fw] = message_reserved
        else:
            reserved.pop(fw, None)
    this_process, others, notes = _message_processes(oom, sum(reserved.values()))
    return Readings(
        total_bytes=_first(oom.total_bytes, sampled.total_bytes),
        free_bytes=_first(oom.free_bytes, sampled.free_bytes),
        used_bytes=sampled.used_bytes,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        this_process_bytes=_first(this_process, sampled.this_process_bytes),
        other_processes_bytes=_first(others, sampled.other_processes_bytes),
        notes=notes,
    )


def _message_reserved(oom: OomInfo) -> int | None:
    if oom.reserved_bytes is not None:
        return oom.reserved_bytes
    if oom.allocated_bytes is not None and oom.reserved_unallocated_bytes is not None:
        return oom.allocated_bytes + oom.reserved_unallocated_bytes
    return None


def _message_processes(
    oom: OomInfo, pool_bytes: int
) -> tuple[int | None, int | None, tuple[str, ...]]:
    """(this process, other processes, notes) from the message's process lines."""
    this_process = oom.this_process_bytes
    listed = [p for p in oom.processes if p.used_bytes is not None]
    if not listed:
        return this_process, None, ()
    mine = [p for p in listed if p.this_process]
    theirs = [p for p in listed if not p.this_process]
    # In a container the message shows host PIDs: a lone "other" process that holds at
    # least our whole pool is, in all likelihood, this process under another PID.
    if this_process is None and not mine and len(theirs) == 1 and pool_bytes:
        used = theirs[0].used_bytes or 0
        if used >= pool_bytes:
            note = (
                f"the message names process {theirs[0].pid}; it holds at least this process's "
                "pool, so it is taken to be this process seen from outside its PID namespace"
            )
            return used, 0, (note,)
    if this_process is None and mine:
        this_process = sum(p.used_bytes or 0 for p in mine)
    return this_process, sum(p.used_bytes or 0 for p in theirs), ()


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


# -- the ledgers a report shows -----------------------------------------------------------


def held_series(trace: Trace, device: int) -> Series | None:
    """The series that best says how much this run held on a device: pool, driver, or live."""
    pools = list(trace.framework_series(Metric.RESERVED, device).values())
    if pools:
        return pools[0] if len(pools) == 1 else sum_series(pools)
    used = trace.series(Metric.GPU_USED, device)
    if used is not None and used.values:
        return used
    live = list(trace.framework_series(Metric.ALLOCATED, device).values())
    if live:
        return live[0] if len(live) == 1 else sum_series(live)
    return None


def peak_moment(trace: Trace, device: int) -> float | None:
    """When the run held the most on a device (a sample instant, so every layer was read).

    Among instants that tie, the one with the most live memory: the pool often stays at its
    high-water mark while the live bytes that filled it come and go.
    """
    series = held_series(trace, device)
    if series is None or not series.values:
        return None
    top = max(series.values)
    tied = [t for t, v in zip(series.times, series.values, strict=True) if v == top]
    live = list(trace.framework_series(Metric.ALLOCATED, device).values())
    if len(tied) == 1 or not live:
        return tied[0]
    return max(tied, key=lambda t: sum(s.at(t) or 0.0 for s in live))


def oom_device(trace: Trace, oom: OomInfo) -> int | None:
    """The GPU an OOM happened on: named by the error, or the only GPU recorded."""
    if oom.framework == "host" or oom.device_type in ("cpu", "tpu"):
        return None
    if oom.device is not None:
        return oom.device
    gpus = [d.index for d in trace.devices() if d.index >= 0]
    return gpus[0] if len(gpus) == 1 else None


def device_ledgers(trace: Trace, oom: OomInfo | None, oom_t: float | None) -> list[Ledger]:
    """For each GPU: the ledger at the run's peak, and at the OOM when it happened there."""
    ledgers: list[Ledger] = []
    failed_on = oom_device(trace, oom) if oom is not None else None
    indices = {d.index for d in trace.devices() if d.index >= 0}
    if failed_on is not None:
        indices.add(failed_on)
    for device in sorted(indices):
        t_peak = peak_moment(trace, device)
        if t_peak is not None:
            ledgers.append(build_ledger(device, "peak", t_peak, readings_at(trace, device, t_peak)))
        if oom is not None and device == failed_on:
            sampled = readings_at(trace, device, oom_t or 0.0)
            readings = readings_from_oom(oom, sampled)
            ledgers.append(build_ledger(device, "oom", oom_t, readings, source="oom message"))
    return ledgers
