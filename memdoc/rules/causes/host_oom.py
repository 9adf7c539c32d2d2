"""MD019 host-oom: the host, not the GPU, ran out of memory."""

from __future__ import annotations

from memdoc.kinds import OomKind
from memdoc.rules.base import Evidence, Finding
from memdoc.rules.causes.host import allocation, kill, shared_memory
from memdoc.rules.causes.host.evidence import error_evidence
from memdoc.rules.causes.host.fixes import (
    BUILD_FIX,
    KILL_FIX,
    KUBERNETES_FIX,
    LIMIT_FIX,
    LOADING_FIX,
    SHM_FIX,
    SLURM_FIX,
    TF_CACHE_FIX,
    WORKERS_FIX,
    Signs,
    error_signs,
    recorded_signs,
)
from memdoc.rules.causes.host.pressure import Pressure, job_pressure, pressure_evidence
from memdoc.rules.causes.host.verdict import Verdict
from memdoc.rules.confidence import STRONG, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.rules.host import HOST_KINDS, cues_of
from memdoc.rules.spec import RuleSpec


class HostOom(RuleSpec):
    slug = "host-oom"
    code = "MD019"
    title = "The host, not the GPU, ran out of memory"
    host_title = "The host ran out of memory"
    what = """
The job died because the machine (or its container's memory limit) ran out of RAM or shared
memory. The kernel's OOM killer sends SIGKILL, so the program prints no Python error: the
shell shows `Killed`, the job scheduler exit code 137, a DataLoader worker "is killed by
signal", or a bus error on `/dev/shm`.
"""
    why = """
Host memory fills with DataLoader workers (each a copy of the dataset object and its
caches), prefetched and pinned batches, a dataset cached in RAM, checkpoints loaded to the
CPU before moving to the GPU, or a model built in fp32 on the CPU first. Docker's default
`/dev/shm` is 64 MB, too small for worker batches.

On a run without a GPU, every memory problem ends with a failed host allocation: there the
failure alone is a symptom, and this rule stays weak unless the kill, the workers or the
shared memory show that the host itself was the limit.

Not every SIGKILL is the OOM killer: a person, a timeout or a scheduler sends it too. When a
recording read the cgroup's OOM-kill counter (which counts kills by any OOM killer) and it
never rose, and memory stayed below half of its limit, this rule does not fire.
"""
    confirm = """
- `dmesg | grep -i -E "killed process|out of memory"` shows the kill.
- The process's resident memory climbs toward the container limit or the machine's RAM
  (`memdoc run` records RSS of the whole process tree, the cgroup's limit and OOM-kill
  count, and each process's address-space cap).
- Fewer DataLoader workers make the failure go away.
"""
    fixes = (
        WORKERS_FIX,
        LOADING_FIX,
        SHM_FIX,
        KILL_FIX,
        SLURM_FIX,
        KUBERNETES_FIX,
        BUILD_FIX,
        TF_CACHE_FIX,
        LIMIT_FIX,
    )
    references = (
        (
            "PyTorch: multi-process data loading",
            "https://pytorch.org/docs/stable/data.html#multi-process-data-loading",
        ),
        (
            "Linux: cgroup v2 memory controller",
            "https://docs.kernel.org/admin-guide/cgroup-v2.html#memory",
        ),
        (
            "Docker: runtime options with memory",
            "https://docs.docker.com/engine/containers/resource_constraints/",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        pressure = None if facts.is_text_only else job_pressure(facts)
        if fail is not None and fail.oom.kind in HOST_KINDS:
            return self._from_error(facts, fail, pressure)
        if pressure is None:
            return None
        return self._from_series(facts, fail, pressure)

    def _from_series(
        self, facts: Facts, fail: Failure | None, pressure: Pressure
    ) -> Finding | None:
        """No host error text: the kill and the memory curve tell."""
        verdict = kill.recorded_kill(facts, fail, pressure)
        if verdict is None:
            return None
        killed = kill.killed_by_signal(facts) or pressure.oom_kills > 0
        signs = recorded_signs(facts, killed=killed)
        return self._report(facts, verdict, pressure_evidence(pressure), signs)

    def _from_error(self, facts: Facts, fail: Failure, pressure: Pressure | None) -> Finding:
        kind = fail.oom.kind
        cues = cues_of(fail)
        signs = error_signs(fail, cues)
        if kind == OomKind.HOST_KILL:
            verdict = kill.text_kill(cues)
        elif signs.shm:
            verdict = shared_memory.shared_memory_verdict(cues, workers=signs.workers)
        elif kind == OomKind.DATALOADER_KILLED:
            verdict = kill.worker_death(cues)
        else:
            verdict = allocation.failed_allocation(facts, fail, cues, workers=signs.workers)
        verdict = _weighed_with(verdict, pressure, kind)
        evidence = error_evidence(facts, fail, pressure)
        return self._report(facts, verdict, evidence, signs, fail)

    def _report(
        self,
        facts: Facts,
        verdict: Verdict,
        evidence: list[Evidence],
        signs: Signs,
        fail: Failure | None = None,
    ) -> Finding:
        involved = facts.frameworks(fail.oom if fail else None)
        return self.finding(
            facts,
            verdict.signals,
            verdict.summary,
            evidence,
            to_confirm=verdict.to_confirm,
            title=verdict.title,
            frameworks=involved,
            fixes=signs.fixes(
                involved,
                facts.trace.header.cgroup_version,
                None if facts.is_text_only else facts.trace.path,
            ),
        )


def _weighed_with(verdict: Verdict, pressure: Pressure | None, kind: str) -> Verdict:
    """A host error near the recorded limit: sure for a kill, corroborated for a failed
    allocation. An unsure kill is confirmed in the kernel's log."""
    signals = verdict.signals
    if pressure is not None and pressure.near_limit and kind != OomKind.HOST_ALLOC:
        signals = Signals(STRONG, signals.corroborating)
    elif pressure is not None and pressure.near_limit:
        signals = signals.plus(near_limit=True)
    to_confirm = verdict.to_confirm
    if kind in (OomKind.HOST_KILL, OomKind.DATALOADER_KILLED) and signals.level < STRONG:
        to_confirm = kill.KILL_HINT
    return Verdict(signals, verdict.summary, to_confirm)


RULE = HostOom()
