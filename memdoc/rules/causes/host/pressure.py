"""How close the job's host memory came to its limit, from the recorded series."""

from __future__ import annotations

from dataclasses import dataclass

from memdoc.kinds import LimitKind
from memdoc.rules.base import Evidence
from memdoc.rules.context import Facts
from memdoc.rules.host import Limit
from memdoc.rules.spec import bytes_evidence, count_evidence, share_evidence
from memdoc.thresholds import nearly_full
from memdoc.trace.model import Metric
from memdoc.units import format_bytes

# A SIGKILL with memory below this share of the limit, and no OOM kill counted, was not for
# memory: a person, a timeout or a scheduler sent it.
FAR_BELOW = 0.5
_CGROUP_USAGE = "peak usage of the cgroup, every process in it counted"
_ADDRESS_SPACE = "peak address space of the capped process"
# What each counted quantity is called in a sentence.
_COUNTED_WORDS = {_CGROUP_USAGE: "cgroup usage", _ADDRESS_SPACE: "address space"}


@dataclass(frozen=True)
class Pressure:
    """How close the host came to its limit, from the recorded series."""

    peak_bytes: float | None  # the job's own processes
    limit_bytes: float | None
    oom_kills: float
    peak_label: str = "peak resident memory of the job"
    limit_label: str = "memory limit"
    # What the limit counts when that is not the job's resident memory: a shared cgroup's
    # usage, or the address space of the capped process.
    counted_label: str = ""
    counted_bytes: float | None = None
    kills_counted: bool = False  # the cgroup's OOM-kill counter was read during the run

    @property
    def used_bytes(self) -> float | None:
        """What the limit counts, at its peak: a shared cgroup's usage or the capped
        process's address space where the limit counts those, else the job's resident peak."""
        return self.counted_bytes if self.counted_bytes is not None else self.peak_bytes

    @property
    def used_share(self) -> float | None:
        """`used_bytes` as a share of the limit."""
        used = self.used_bytes
        return used / self.limit_bytes if used is not None and self.limit_bytes else None

    @property
    def reached_words(self) -> str:
        """What came near the limit, in the limit's own terms: "7.8 GiB of cgroup usage (3.0
        GiB resident of its own)" where the limit counts more than the job's resident
        memory, else "3.0 GiB resident"."""
        resident = f"{format_bytes(self.peak_bytes)} resident"
        if self.counted_bytes is None:
            return resident
        own = f" ({resident} of its own)" if self.peak_bytes is not None else ""
        return f"{format_bytes(self.counted_bytes)} of {_COUNTED_WORDS[self.counted_label]}{own}"

    @property
    def kill_not_for_memory(self) -> bool:
        """The recording rules the OOM killer out: its counter for the job's cgroup was read
        and never rose (it counts kills by any OOM killer), and memory stayed far below the
        limit."""
        share = self.used_share
        return (
            self.kills_counted and self.oom_kills == 0 and share is not None and share < FAR_BELOW
        )

    @property
    def near_limit(self) -> bool:
        share = self.used_share
        return share is not None and nearly_full(share, 1.0)


def job_pressure(facts: Facts) -> Pressure | None:
    """The job's peak, its limit and the OOM kills counted; None when none was recorded."""
    held = facts.job_peak_resident()
    limit = facts.job_limit()
    kills = facts.trace.series(Metric.CGROUP_OOM_KILLS)
    rose = 0.0
    counted = kills is not None and len(kills) > 0
    if kills is not None and counted:
        rose = max(kills.values) - kills.values[0]
    if held is None and limit is None and kills is None:
        return None
    counted_label, counted_bytes = _counted(facts, limit, held.label if held else "")
    return Pressure(
        held.held_bytes if held else None,
        limit.limit_bytes if limit else None,
        rose,
        peak_label=held.label if held else "peak resident memory of the job",
        limit_label=limit.label if limit else "memory limit",
        counted_label=counted_label,
        counted_bytes=counted_bytes,
        kills_counted=counted,
    )


def _counted(facts: Facts, limit: Limit | None, held_label: str) -> tuple[str, float | None]:
    """What the binding limit measures, when it is not the job's resident memory."""
    if limit is None:
        return "", None
    if limit.kind == LimitKind.CGROUP and "cgroup" not in held_label:
        usage = facts.trace.peak(Metric.CGROUP_USAGE)
        if usage is not None:
            return _CGROUP_USAGE, usage[1]
    if limit.kind == LimitKind.RLIMIT_AS:
        vms = facts.trace.peak(Metric.HOST_VMS, None, facts.root_pid)
        if vms is not None:
            return _ADDRESS_SPACE, vms[1]
    return "", None


def pressure_evidence(pressure: Pressure, *, with_limit: bool = True) -> list[Evidence]:
    """The peak, what the limit counts, the limit and the share, and the OOM kills."""
    evidence: list[Evidence] = []
    if pressure.peak_bytes is not None:
        evidence.append(bytes_evidence(pressure.peak_label, pressure.peak_bytes))
    if pressure.counted_bytes is not None and with_limit:
        evidence.append(bytes_evidence(pressure.counted_label, pressure.counted_bytes))
    if pressure.limit_bytes and with_limit:
        evidence.append(bytes_evidence(pressure.limit_label, pressure.limit_bytes))
        if pressure.used_share is not None:
            evidence.append(share_evidence("peak / limit", pressure.used_share))
    if pressure.oom_kills:
        evidence.append(count_evidence("OOM kills in the job's cgroup", pressure.oom_kills))
    return evidence
