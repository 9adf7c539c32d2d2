"""The memory ledger of one device at one instant: terms that add up to the device total."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from memdoc.trace.model import (
    FRAMEWORK_NAMES,
    FRAMEWORK_PREFIXES,
    Metric,
    OomInfo,
    framework_metric,
)
from memdoc.trace.reader import Trace
from memdoc.units import format_bytes

# Term keys, in the order a bar stacks them (left to right).
ALLOCATED = "allocated"
CACHED_FREE = "cached_free"
RESERVED = "reserved"  # a pool whose allocated part is unknown
PROCESS_OTHER = "process_other"
OTHER_PROCESSES = "other_processes"
FREE = "free"
UNEXPLAINED = "unexplained"

# What an unmeasured term is called where the ledger names what it could not see.
UNKNOWN_LABELS = {
    PROCESS_OTHER: "CUDA context and other allocators of this process",
    OTHER_PROCESSES: "other processes",
    FREE: "free",
}
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
    # False for a system view: no process is the run's, so every process is just "a process".
    run_known: bool = True


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
    terms do not cover is the `unexplained` term, always present. Terms that could not be
    measured are listed by key in `unknown` (their bytes sit in the remainder).
    """

    device: int
    moment: str  # "now" (the dashboard), "peak" or "oom" (the report)
    t: float | None
    total_bytes: int | None
    terms: tuple[LedgerTerm, ...]
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    source: str = "samples"  # or "oom message"
    run_known: bool = True

    @property
    def accounted_bytes(self) -> int:
        return sum(term.bytes for term in self.terms)

    @property
    def unknown_labels(self) -> tuple[str, ...]:
        return tuple(UNKNOWN_LABELS[key] for key in self.unknown)

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
    elif readings.run_known:
        unknown.append(PROCESS_OTHER)
    if readings.other_processes_bytes is not None:
        label = "other processes" if readings.run_known else "processes"
        terms.append(LedgerTerm(OTHER_PROCESSES, label, readings.other_processes_bytes))
    else:
        unknown.append(OTHER_PROCESSES)
    free = readings.free_bytes
    if free is None and readings.total_bytes is not None and readings.used_bytes is not None:
        free = readings.total_bytes - readings.used_bytes
    if free is not None:
        terms.append(LedgerTerm(FREE, "free", free))
    else:
        unknown.append(FREE)
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
        run_known=readings.run_known,
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


def framework_pids(trace: Trace, device: int) -> set[int]:
    """Processes that reported framework counters (allocated or reserved) on a device."""
    metrics = {
        framework_metric(fw, quantity)
        for fw in FRAMEWORK_PREFIXES
        for quantity in (Metric.ALLOCATED, Metric.RESERVED)
    }
    return {
        k.pid
        for k in trace.series_keys()
        if k.device == device and k.metric in metrics and k.pid is not None
    }


def run_pids(trace: Trace, device: int) -> set[int]:
    """Processes of this run: recorded as ours, the recorder's own, or with framework counters.

    A system view (`memdoc top`) records as an observer: its own process is not a run.
    """
    pids = trace.our_pids() | framework_pids(trace, device)
    if trace.header.pid is not None and trace.header.mode != "system":
        pids.add(trace.header.pid)
    return pids


def ledger_at(trace: Trace, device: int, t: float, *, moment: str = "now") -> Ledger:
    """The ledger of `device` from the last values recorded at or before `t`."""
    return build_ledger(device, moment, t, readings_at(trace, device, t))


def readings_at(trace: Trace, device: int, t: float) -> Readings:
    """Every layer of one device as last recorded at or before `t` (nothing later is read)."""
    this_process: int | None = None
    others: int | None = None
    ours = run_pids(trace, device)
    per_process = {
        s.key.pid: value
        for s in trace.series_for(Metric.GPU_PROC_USED, device=device)
        if (value := s.at(t)) is not None
    }
    if per_process:
        others = int(sum(v for pid, v in per_process.items() if pid not in ours))
        if ours:
            this_process = int(sum(v for pid, v in per_process.items() if pid in ours))
    return Readings(
        total_bytes=trace.device_total_bytes(device),
        free_bytes=_int_at(trace, Metric.GPU_FREE, device, t),
        used_bytes=_int_at(trace, Metric.GPU_USED, device, t),
        allocated_bytes=_framework_at(trace, Metric.ALLOCATED, device, t),
        reserved_bytes=_framework_at(trace, Metric.RESERVED, device, t),
        this_process_bytes=this_process,
        other_processes_bytes=others,
        run_known=bool(ours),
    )


def _int_at(trace: Trace, metric: str, device: int, t: float) -> int | None:
    series = trace.series(metric, device=device)
    value = series.at(t) if series is not None else None
    return None if value is None else int(value)


def _framework_at(trace: Trace, quantity: str, device: int, t: float) -> dict[str, int]:
    """{framework: bytes} summed over the framework's processes on the device."""
    out: dict[str, int] = {}
    for fw in FRAMEWORK_PREFIXES:
        series = trace.series_for(framework_metric(fw, quantity), device=device)
        values = [v for s in series if (v := s.at(t)) is not None]
        if values:
            out[fw] = int(sum(values))
    return out


# -- readings from an OOM message ---------------------------------------------------------


def ledger_at_oom(trace: Trace, device: int, oom: OomInfo, t: float | None) -> Ledger:
    """The ledger at an OOM: the message's numbers, exact at the failure, then the samples.

    Without the instant of the failure only the device total is taken from the trace.
    """
    if t is None:
        sampled = Readings(total_bytes=trace.device_total_bytes(device))
    else:
        sampled = readings_at(trace, device, t)
    readings = readings_from_oom(oom, sampled)
    return build_ledger(device, "oom", t, readings, source="oom message")


def oom_this_process_bytes(oom: OomInfo) -> int | None:
    """What the message says this process held, unless it is a sentinel (above the device)."""
    value = oom.this_process_bytes
    if value is None or (oom.total_bytes is not None and value > oom.total_bytes):
        return None
    return value


def oom_reserved_bytes(oom: OomInfo) -> int | None:
    """The framework's pool as the message states it: reserved, or allocated + unallocated."""
    if oom.reserved_bytes is not None:
        return oom.reserved_bytes
    if oom.allocated_bytes is not None and oom.reserved_unallocated_bytes is not None:
        return oom.allocated_bytes + oom.reserved_unallocated_bytes
    return None


def readings_from_oom(oom: OomInfo, sampled: Readings) -> Readings:
    """The error message's numbers (exact at the failure), completed by the samples."""
    fw = oom.framework if oom.framework in FRAMEWORK_NAMES else None
    allocated = dict(sampled.allocated_bytes)
    reserved = dict(sampled.reserved_bytes)
    if fw is not None and oom.allocated_bytes is not None:
        allocated[fw] = oom.allocated_bytes
        message_reserved = oom_reserved_bytes(oom)
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


def _message_processes(
    oom: OomInfo, pool_bytes: int
) -> tuple[int | None, int | None, tuple[str, ...]]:
    """(this process, other processes, notes) from the message's process lines."""
    this_process = oom_this_process_bytes(oom)
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
