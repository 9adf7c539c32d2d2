"""MD019 host-oom: the host, not the GPU, ran out of memory."""

from __future__ import annotations

from dataclasses import dataclass

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.facts import Failure, failure, frameworks
from memdoc.rules.spec import (
    LIKELY,
    POSSIBLE,
    STRONG,
    WEAK,
    RuleSpec,
    bytes_evidence,
    count_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.model import EventKind, Metric
from memdoc.trace.reader import Trace
from memdoc.units import format_bytes

HOST_KINDS = ("host-kill", "host-alloc", "shm", "dataloader-killed")
SIGKILL = 9
NEAR_LIMIT = 0.9
_KERNEL_OOM = (
    r"Out of memory: Kill|oom-kill|oom_kill|Killed process \d+|Memory cgroup out of memory"
    r"|OOMKilled"
)
_SHM = r"Bus error|shared memory|/dev/shm"
_TEXT_CONFIDENCE = {
    "host-alloc": LIKELY + 0.1,
    "shm": STRONG - 0.05,
}


@dataclass(frozen=True)
class _Pressure:
    """How close the host came to its limit, from the recorded series."""

    peak_bytes: float | None
    limit_bytes: float | None
    oom_kills: float

    @property
    def near_limit(self) -> bool:
        return bool(self.peak_bytes and self.limit_bytes) and (
            float(self.peak_bytes or 0) >= NEAR_LIMIT * float(self.limit_bytes or 1)
        )


class HostOom(RuleSpec):
    slug = "host-oom"
    code = "MD019"
    title = "The host, not the GPU, ran out of memory"
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
"""
    confirm = """
- `dmesg | grep -i -E "killed process|out of memory"` shows the kill.
- The process's resident memory climbs toward the container limit or the machine's RAM
  (`memdoc run` records RSS of the whole process tree and the cgroup's limit and OOM-kill
  count).
- Fewer DataLoader workers make the failure go away.
"""
    fixes = (
        Fix(
            "pytorch",
            "Fewer workers, less prefetching, no pinned staging",
            snippet(
                """
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=32, num_workers=2, prefetch_factor=2, pin_memory=False
            )
            """
            ),
        ),
        Fix(
            "pytorch",
            "Load large models without a full copy in RAM",
            snippet(
                """
            model = AutoModelForCausalLM.from_pretrained(
                name, low_cpu_mem_usage=True, device_map="auto"
            )
            """
            ),
        ),
        Fix("any", "Give containers more shared memory", "docker run --shm-size=8g ...", "bash"),
        Fix(
            "any",
            "See what the kernel killed",
            'dmesg | grep -i -E "killed process|out of memory"',
            "bash",
        ),
        Fix(
            "tensorflow",
            "Stream the dataset instead of caching it in RAM",
            snippet(
                """
            # drop .cache(), or cache to a file instead of RAM
            dataset = dataset.cache("/tmp/dataset.cache").prefetch(tf.data.AUTOTUNE)
            """
            ),
        ),
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

    def check(self, trace: Trace) -> Finding | None:
        fail = failure(trace)
        pressure = None if trace.is_text_only else _pressure(trace)
        if fail is not None and fail.oom.kind in HOST_KINDS:
            return self._from_error(trace, fail, pressure)
        if pressure is None:
            return None
        killed = _killed(trace)
        evidence = _pressure_evidence(pressure)
        if pressure.oom_kills > 0:
            summary = (
                f"The kernel's OOM killer killed {pressure.oom_kills:g} process(es) of this job."
            )
            return self.finding(
                trace, STRONG + 0.1, summary, evidence, frameworks=frameworks(trace)
            )
        if killed and pressure.near_limit:
            summary = (
                f"The job was killed (SIGKILL) with {format_bytes(pressure.peak_bytes)} resident, "
                f"near the {format_bytes(pressure.limit_bytes)} limit."
            )
            return self.finding(
                trace, STRONG + 0.05, summary, evidence, frameworks=frameworks(trace)
            )
        if killed:
            summary = "The job was killed by SIGKILL; the kernel's OOM killer is the usual sender."
            return self.finding(
                trace,
                POSSIBLE - 0.1,
                summary,
                evidence,
                to_confirm='run `dmesg | grep -i "killed process"` on the machine',
            )
        if pressure.near_limit and fail is None:
            summary = (
                f"Host memory reached {format_bytes(pressure.peak_bytes)}, close to the limit."
            )
            return self.finding(trace, POSSIBLE - 0.05, summary, evidence)
        return None

    def _from_error(self, trace: Trace, fail: Failure, pressure: _Pressure | None) -> Finding:
        oom = fail.oom
        if oom.kind == "host-kill":
            kernel = fail.says(_KERNEL_OOM)
            confidence = STRONG + 0.05 if kernel else LIKELY - 0.05
            summary = (
                "The kernel's OOM killer killed the process."
                if kernel
                else "The process was killed without a Python error, the mark of the OOM killer."
            )
        elif oom.kind == "shm" or (oom.kind == "dataloader-killed" and fail.says(_SHM)):
            confidence = _TEXT_CONFIDENCE["shm"]
            summary = "A DataLoader worker ran out of shared memory (/dev/shm)."
        elif oom.kind == "dataloader-killed":
            confidence, summary = _worker_death(fail)
        else:
            confidence = _TEXT_CONFIDENCE.get(oom.kind, LIKELY)
            summary = "An allocation in host memory (RAM) failed."
        evidence: list[Evidence] = []
        if oom.requested_bytes:
            evidence.append(bytes_evidence("requested in host memory", oom.requested_bytes))
        if pressure is not None:
            evidence.extend(_pressure_evidence(pressure))
            if pressure.near_limit:
                confidence = max(confidence, STRONG)
        kill_hint = oom.kind in ("host-kill", "dataloader-killed") and confidence < STRONG
        return self.finding(
            trace,
            confidence,
            summary,
            evidence,
            to_confirm='run `dmesg | grep -i "killed process"` to see the kill'
            if kill_hint
            else None,
            frameworks=frameworks(trace, oom),
        )


def _worker_death(fail: Failure) -> tuple[float, str]:
    """How a DataLoader worker died: SIGKILL points at the OOM killer, SIGTERM does not."""
    if fail.says(r"signal: Killed"):
        return LIKELY + 0.1, "A DataLoader worker was killed by SIGKILL, usually the OOM killer."
    if fail.says(r"signal: Terminated"):
        summary = "A DataLoader worker was terminated (SIGTERM): rarely a memory problem."
        return WEAK, summary
    summary = "A DataLoader worker exited unexpectedly; running out of host RAM is one cause."
    return POSSIBLE, summary


def _pressure(trace: Trace) -> _Pressure | None:
    rss = trace.peak(Metric.CGROUP_USAGE) or trace.peak(Metric.HOST_RSS)
    limit_series = trace.series(Metric.CGROUP_LIMIT) or trace.series(Metric.HOST_TOTAL)
    limit = limit_series.last() if limit_series is not None else None
    kills = trace.series(Metric.CGROUP_OOM_KILLS)
    rose = 0.0
    if kills is not None and len(kills):
        rose = max(kills.values) - kills.values[0]
    if rss is None and limit is None and kills is None:
        return None
    return _Pressure(rss[1] if rss else None, limit[1] if limit else None, rose)


def _killed(trace: Trace) -> bool:
    if trace.exit is not None and trace.exit.signal == SIGKILL:
        return True
    return any(e.data.get("signal") == SIGKILL for e in trace.events(EventKind.PROCESS_EXIT))


def _pressure_evidence(pressure: _Pressure) -> list[Evidence]:
    evidence: list[Evidence] = []
    if pressure.peak_bytes is not None:
        evidence.append(bytes_evidence("peak resident memory of the job", pressure.peak_bytes))
    if pressure.limit_bytes:
        evidence.append(bytes_evidence("memory limit", pressure.limit_bytes))
        if pressure.peak_bytes is not None:
            evidence.append(
                share_evidence("peak / limit", pressure.peak_bytes / pressure.limit_bytes)
            )
    if pressure.oom_kills:
        evidence.append(count_evidence("OOM kills in the job's cgroup", pressure.oom_kills))
    return evidence


RULE = HostOom()
