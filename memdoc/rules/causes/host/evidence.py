"""The evidence of a host error: what it asked for, the job's pressure, the failing process."""

from __future__ import annotations

from memdoc.kinds import LimitKind
from memdoc.rules.base import Evidence
from memdoc.rules.causes.host.pressure import Pressure, pressure_evidence
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.rules.host import (
    Limit,
)
from memdoc.rules.spec import bytes_evidence, share_evidence
from memdoc.trace.model import Metric


def error_evidence(facts: Facts, fail: Failure, pressure: Pressure | None) -> list[Evidence]:
    """The request, then the job's memory against its limit, or the failing process's own."""
    evidence: list[Evidence] = []
    if fail.oom.requested_bytes:
        evidence.append(bytes_evidence("requested in host memory", fail.oom.requested_bytes))
    if pressure is None:
        return evidence
    limits = facts.host_limits(fail.pid, fail.host)
    own = limits[0] if limits else None
    if own is not None and pressure.limit_bytes and own.limit_bytes < pressure.limit_bytes:
        # The failing process had a limit of its own, tighter than the job's (a rank that
        # set RLIMIT_AS, a worker in a smaller cgroup): weigh it against that one.
        evidence.extend(pressure_evidence(pressure, with_limit=False))
        evidence.extend(_own_limit_evidence(facts, fail, own))
        return evidence
    evidence.extend(pressure_evidence(pressure))
    evidence.extend(_dead_processes(facts, fail))
    evidence.extend(_growth_beside_the_steps(facts))
    resident = facts.resident_at_failure(fail)
    if limits and limits[0].label.startswith("address-space") and resident:
        cap = bytes_evidence(limits[0].label, limits[0].limit_bytes)
        if cap.text not in {e.text for e in evidence}:  # the job's limit may be this cap
            evidence.append(cap)
        evidence.append(bytes_evidence("resident memory of the failing process", resident))
    return evidence


def _growth_beside_the_steps(facts: Facts) -> list[Evidence]:
    """The memory that grew in the processes beside the training one, which did not grow."""
    growth = facts.process_growth()
    if growth is None or growth.training_grew or not growth.beside:
        return []
    grew = growth.beside
    per_step = sum(trend.robust_slope_per_step for _, trend in grew)
    label = f"growth per step of {len(grew)} process{'es' if len(grew) > 1 else ''} beside"
    held = sum(max((s.baseline or 0.0) for s in curve.steps) for curve, _ in grew)
    return [
        bytes_evidence(f"{label} the training process, which held flat", per_step),
        bytes_evidence("the most they held of their own", held),
    ]


def _dead_processes(facts: Facts, fail: Failure) -> list[Evidence]:
    """The peaks of the other processes the error says died (workers, children)."""
    evidence = []
    for process in fail.oom.processes:
        worker = facts.trace.peak(Metric.HOST_RSS, None, process.pid) if process.pid else None
        if worker is not None and process.pid != fail.pid:
            label = f"peak resident memory of process {process.pid}, which died"
            evidence.append(bytes_evidence(label, worker[1]))
    return evidence


def _own_limit_evidence(facts: Facts, fail: Failure, own: Limit) -> list[Evidence]:
    """The failing process's own limit and what it counts (address space for RLIMIT_AS,
    resident memory for a cgroup), at the error."""
    if own.kind == LimitKind.RLIMIT_AS:
        label, used = "address space of the failing process", facts.address_space_at_failure(fail)
    else:
        label, used = "resident memory of the failing process", facts.resident_at_failure(fail)
    evidence = [bytes_evidence(own.label, own.limit_bytes)]
    if used is not None:
        evidence.append(bytes_evidence(label, used))
        evidence.append(share_evidence(f"{label} / its limit", used / own.limit_bytes))
    return evidence
