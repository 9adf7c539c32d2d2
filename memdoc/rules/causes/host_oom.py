"""MD019 host-oom: the host, not the GPU, ran out of memory."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.facts import Failure, failure, frameworks, root_pid
from memdoc.rules.host import (
    HOST_KINDS,
    Limit,
    address_space_at_failure,
    gpu_recorded,
    host_limits,
    job_limit,
    job_peak_resident,
    resident_at_failure,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.model import EventKind, Metric
from memdoc.trace.reader import Trace
from memdoc.units import format_bytes

SIGKILL = 9
NEAR_LIMIT = 0.9
# A SIGKILL with memory below this share of the limit, and no OOM kill counted, was not for
# memory: a person, a timeout or a scheduler sent it.
FAR_BELOW = 0.5
_KERNEL_OOM = (
    r"Out of memory: Kill|oom-kill|oom_kill|Killed process \d+|Memory cgroup out of memory"
    r"|OOMKilled"
)
# A scheduler or a hosted platform saying in words that the job ran out of memory.
_PLATFORM_OOM = (
    r"exceeded (?:job )?memory limit|OOM[- ]killed|instance type with more memory"
    r"|using all available RAM|allocate more memory than is available"
    r"|low on resource: memory|running low on memory|memory budget\. Restarting"
)
_SHM = r"Bus error|shared memory|/dev/shm"
# What ties a bus error to shared memory: the words, or the workers that share it.
_SHM_CONTEXT = r"shared memory|/dev/shm|\bshm\b|DataLoader|worker|torch_\d"
_DATALOADER_TEXT = r"DataLoader worker"
_DATALOADER_FILES = r"torch[/\\]utils[/\\]data[/\\]"
_LOADING_WORDS = ("from pretrained", "load")
_KILL_HINT = 'run `dmesg | grep -i "killed process"` to see the kill'

WORKERS_FIX = Fix(
    "pytorch",
    "Fewer workers, less prefetching, no pinned staging",
    snippet(
        """
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=32, num_workers=2, prefetch_factor=2, pin_memory=False
    )
    """
    ),
)
LOADING_FIX = Fix(
    "pytorch",
    "Load large models without a full copy in RAM",
    snippet(
        """
    model = AutoModelForCausalLM.from_pretrained(
        name, low_cpu_mem_usage=True, device_map="auto"
    )
    """
    ),
)
SHM_FIX = Fix("any", "Give containers more shared memory", "docker run --shm-size=8g ...", "bash")
KILL_FIX = Fix(
    "any", "See what the kernel killed", 'dmesg | grep -i -E "killed process|out of memory"', "bash"
)
SLURM_FIX = Fix(
    "any",
    "Ask SLURM for more memory, after seeing what the job used",
    "sacct -j $SLURM_JOB_ID -o JobID,MaxRSS,ReqMem,State   # what it used and asked for\n"
    "#SBATCH --mem=64G                                      # in the job script",
    "bash",
)
BUILD_FIX = Fix(
    "any",
    "Build with fewer compilers at once (each can take several GB)",
    "MAX_JOBS=2 pip install flash-attn --no-build-isolation   # ninja's parallel jobs",
    "bash",
)
KUBERNETES_FIX = Fix(
    "any",
    "Raise the container's memory limit (or request what it really uses)",
    "kubectl describe pod POD | grep -A3 'Last State'       # OOMKilled, and when\n"
    "kubectl set resources deployment/NAME --limits=memory=32Gi",
    "bash",
)
TF_CACHE_FIX = Fix(
    "tensorflow",
    "Stream the dataset instead of caching it in RAM",
    snippet(
        """
    # drop .cache(), or cache to a file instead of RAM
    dataset = dataset.cache("/tmp/dataset.cache").prefetch(tf.data.AUTOTUNE)
    """
    ),
)
LIMIT_FIX = Fix(
    "any",
    "Find what grew, then shrink it or give the job more memory",
    snippet(
        """
    memdoc report run.memdoc          # which memory grew, and when
    ulimit -v                         # this shell's address-space cap (unlimited = none)
    cat /sys/fs/cgroup/memory.max     # the container's limit (cgroup v2)
    """
    ),
    "bash",
)
# The same, on a machine whose memory cgroup is v1 (memory.max does not exist there).
LIMIT_FIX_V1 = replace(
    LIMIT_FIX,
    code=LIMIT_FIX.code.replace(
        "cat /sys/fs/cgroup/memory.max     # the container's limit (cgroup v2)",
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes   # the container's limit (cgroup v1)",
    ),
)


@dataclass(frozen=True)
class _Pressure:
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
        return share is not None and share >= NEAR_LIMIT


@dataclass(frozen=True)
class _Signs:
    """What the evidence points at, so that only the fixes it calls for are offered."""

    killed: bool = False
    workers: bool = False
    shm: bool = False
    loading: bool = False
    scheduler: str | None = None  # "slurm" or "kubernetes", when the text names one
    building: bool = False  # a compiler was killed while building an extension

    def fixes(
        self, involved: list[str], cgroup_version: int | None, trace_path: Path | None = None
    ) -> tuple[Fix, ...]:
        limit_fix = LIMIT_FIX_V1 if cgroup_version == 1 else LIMIT_FIX
        if trace_path is not None:  # name the trace the person has, not an example's
            example = re.search(r"memdoc report run\.memdoc +", limit_fix.code)
            if example is not None:  # the comments stay in their column where the name fits
                named = f"memdoc report {shlex.quote(str(trace_path))}"
                named = named.ljust(len(example[0]) - 1) + " "
                code = limit_fix.code.replace(example[0], named)
                limit_fix = replace(limit_fix, code=code)
        return tuple(
            fix
            for fix, wanted in (
                (WORKERS_FIX, self.workers or self.shm),
                (SHM_FIX, self.shm),
                (LOADING_FIX, self.loading),
                (BUILD_FIX, self.building),
                (SLURM_FIX, self.scheduler == "slurm"),
                (KUBERNETES_FIX, self.scheduler == "kubernetes"),
                (KILL_FIX, self.killed and self.scheduler is None),
                (TF_CACHE_FIX, "tensorflow" in involved),
                (limit_fix, True),
            )
            if wanted
        )


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

    def check(self, trace: Trace) -> Finding | None:
        fail = failure(trace)
        pressure = None if trace.is_text_only else _pressure(trace)
        if fail is not None and fail.oom.kind in HOST_KINDS:
            return self._from_error(trace, fail, pressure)
        if pressure is None:
            return None
        return self._from_series(trace, fail, pressure)

    def _from_series(
        self, trace: Trace, fail: Failure | None, pressure: _Pressure
    ) -> Finding | None:
        """No host error text: the kill and the memory curve tell."""
        killed = _killed(trace)
        signs = _Signs(killed=killed or pressure.oom_kills > 0, workers=_several_processes(trace))
        evidence = _pressure_evidence(pressure)
        if pressure.oom_kills > 0:
            summary = (
                f"The kernel's OOM killer killed {pressure.oom_kills:g} process(es) of this job."
            )
            signals = Signals.of(STRONG, near_limit=pressure.near_limit)
        elif killed and pressure.near_limit:
            summary = (
                f"The job was killed (SIGKILL) with {pressure.reached_words}, near the "
                f"{format_bytes(pressure.limit_bytes)} {pressure.limit_label}."
            )
            signals = Signals(STRONG)
        elif killed and pressure.kill_not_for_memory:
            return None
        elif killed:
            summary = "The job was killed by SIGKILL; the kernel's OOM killer is the usual sender."
            return self._report(
                trace, Signals(POSSIBLE), summary, evidence, signs=signs, to_confirm=_KILL_HINT
            )
        elif pressure.near_limit and fail is None:
            summary = (
                f"The job reached {pressure.reached_words}, close to the "
                f"{format_bytes(pressure.limit_bytes)} {pressure.limit_label}."
            )
            signals = Signals(POSSIBLE)
        else:
            return None
        return self._report(trace, signals, summary, evidence, signs=signs)

    def _from_error(self, trace: Trace, fail: Failure, pressure: _Pressure | None) -> Finding:
        oom = fail.oom
        signs = _signs_of(fail)
        to_confirm = None
        if oom.kind == "host-kill":
            kernel = fail.says(_KERNEL_OOM)
            platform = not kernel and fail.says(_PLATFORM_OOM)
            signals = Signals(STRONG if kernel or platform else LIKELY)
            if kernel:
                summary = "The kernel's OOM killer killed the process."
            elif platform:
                summary = "The scheduler or platform says the job ran out of memory and stopped it."
            else:
                summary = (
                    "The process was killed without a Python error, the mark of the OOM killer."
                )
        elif signs.shm and not fail.says(_SHM_CONTEXT) and not signs.workers:
            signals = Signals(POSSIBLE)
            summary = (
                "A bus error with nothing around it: shared memory (/dev/shm) running out is "
                "the usual cause in a training job, but a full disk, a damaged file or a "
                "mapping the hardware refused end the same way."
            )
        elif signs.shm:
            signals = Signals(STRONG)
            summary = "A DataLoader worker ran out of shared memory (/dev/shm)."
        elif oom.kind == "dataloader-killed":
            signals, summary = _worker_death(fail)
        else:
            signals, summary, to_confirm = _failed_allocation(trace, fail, signs)
        evidence = _error_evidence(trace, fail, pressure)
        if pressure is not None and pressure.near_limit and oom.kind != "host-alloc":
            signals = Signals(STRONG, signals.corroborating)
        elif pressure is not None and pressure.near_limit:
            signals = signals.plus(near_limit=True)
        if oom.kind in ("host-kill", "dataloader-killed") and signals.level < STRONG:
            to_confirm = _KILL_HINT
        return self._report(
            trace, signals, summary, evidence, signs=signs, to_confirm=to_confirm, fail=fail
        )

    def _report(
        self,
        trace: Trace,
        signals: Signals,
        summary: str,
        evidence: list[Evidence],
        *,
        signs: _Signs,
        to_confirm: str | None = None,
        fail: Failure | None = None,
    ) -> Finding:
        involved = frameworks(trace, fail.oom if fail else None)
        return self.finding(
            trace,
            signals,
            summary,
            evidence,
            to_confirm=to_confirm,
            frameworks=involved,
            fixes=signs.fixes(
                involved,
                trace.header.cgroup_version,
                None if trace.is_text_only else trace.path,
            ),
        )


_BAD_ALLOC = r"std::bad_alloc"
# The words of a failure that is the host's by what it names: its allocator, RAM, an errno.
_HOST_NAMED = (
    r"\bcpu|host|\bram\b|system memory|swap|malloc|calloc|MemoryError|bad_alloc|mmap|errno"
    r"|cannot allocate memory|insufficient memory|not enough memory|can't allocate region"
    r"|java\.lang|paging file|memory limit|oom-kill|numpy"
)
# A compiler the kernel killed: an extension built with too many parallel jobs.
_COMPILER = r"cc1plus|\bcicc\b|\bnvcc\b|\bninja\b"


def _signs_of(fail: Failure) -> _Signs:
    oom = fail.oom
    shm = oom.kind == "shm" or (oom.kind == "dataloader-killed" and fail.says(_SHM))
    workers = (
        oom.kind == "dataloader-killed"
        or fail.says(_DATALOADER_TEXT)
        or fail.in_frames(file_pattern=_DATALOADER_FILES)
    )
    return _Signs(
        killed=oom.kind in ("host-kill", "dataloader-killed"),
        workers=workers,
        shm=shm,
        loading=oom.phase == "load" or fail.in_frames(function_words=_LOADING_WORDS),
        scheduler=_scheduler(fail),
        building=oom.kind == "host-kill" and fail.says(_COMPILER),
    )


def _scheduler(fail: Failure) -> str | None:
    """The scheduler whose limit killed the job, when the text names it."""
    if fail.says(r"slurmstepd|\bslurm\b|\bsbatch\b|\bsrun\b"):
        return "slurm"
    if fail.says(r"OOMKilled|kubelet|kubectl|container init was OOM-killed|low on resource"):
        return "kubernetes"
    return None


def _failed_allocation(
    trace: Trace, fail: Failure, signs: _Signs
) -> tuple[Signals, str, str | None]:
    """A host allocation failed: the limit itself only when nothing else can be blamed."""
    if signs.workers:
        summary = "A DataLoader worker could not allocate host memory (RAM)."
        return Signals(STRONG), summary, None
    if trace.is_text_only and fail.oom.requested_bytes is None and fail.says(_BAD_ALLOC):
        summary = (
            "A C++ allocation failed (std::bad_alloc) without saying its size: host memory ran "
            "out, or a size read from a damaged file or bad input asked for more than any "
            "machine has."
        )
        return Signals(WEAK), summary, "watch the process's memory as it fails (`memdoc run`)"
    if trace.is_text_only and not fail.says(_HOST_NAMED):
        # A bare "out of memory" that names no device: the host's only as often as not.
        summary = "An allocation failed, and the text names no GPU: host memory (RAM) ran out."
        return Signals(POSSIBLE), summary, "watch the process's memory as it fails (`memdoc run`)"
    if trace.is_text_only:
        return Signals(STRONG), "An allocation in host memory (RAM) failed.", None
    if gpu_recorded(trace):
        summary = "A host memory (RAM) allocation failed in a GPU job: RAM, not the GPU, ran out."
        return Signals(LIKELY), summary, None
    limits = host_limits(trace, fail.pid, fail.host)
    under = f" under the {format_bytes(limits[0].limit_bytes)} {limits[0].label}" if limits else ""
    summary = (
        f"An allocation in host memory failed{under}. The run used no GPU, so every memory "
        "problem ends this way here: the cause is what drove memory up."
    )
    to_confirm = "look at the other findings, and at `memdoc report` for what grew"
    return Signals(WEAK), summary, to_confirm


def _worker_death(fail: Failure) -> tuple[Signals, str]:
    """How a DataLoader worker died: SIGKILL points at the OOM killer, SIGTERM does not."""
    if fail.says(r"signal: Killed"):
        return Signals(STRONG), "A DataLoader worker was killed by SIGKILL, usually the OOM killer."
    if fail.says(r"signal: Terminated"):
        summary = "A DataLoader worker was terminated (SIGTERM): rarely a memory problem."
        return Signals(WEAK), summary
    summary = "A DataLoader worker exited unexpectedly; running out of host RAM is one cause."
    return Signals(POSSIBLE), summary


def _error_evidence(trace: Trace, fail: Failure, pressure: _Pressure | None) -> list[Evidence]:
    evidence: list[Evidence] = []
    if fail.oom.requested_bytes:
        evidence.append(bytes_evidence("requested in host memory", fail.oom.requested_bytes))
    if pressure is None:
        return evidence
    limits = host_limits(trace, fail.pid, fail.host)
    own = limits[0] if limits else None
    if own is not None and pressure.limit_bytes and own.limit_bytes < pressure.limit_bytes:
        # The failing process had a limit of its own, tighter than the job's (a rank that
        # set RLIMIT_AS, a worker in a smaller cgroup): weigh it against that one.
        evidence.extend(_pressure_evidence(pressure, with_limit=False))
        evidence.extend(_own_limit_evidence(trace, fail, own))
        return evidence
    evidence.extend(_pressure_evidence(pressure))
    for process in fail.oom.processes:
        worker = trace.peak(Metric.HOST_RSS, None, process.pid) if process.pid else None
        if worker is not None and process.pid != fail.pid:
            label = f"peak resident memory of process {process.pid}, which died"
            evidence.append(bytes_evidence(label, worker[1]))
    resident = resident_at_failure(trace, fail)
    if limits and limits[0].label.startswith("address-space") and resident:
        cap = bytes_evidence(limits[0].label, limits[0].limit_bytes)
        if cap.text not in {e.text for e in evidence}:  # the job's limit may be this cap
            evidence.append(cap)
        evidence.append(bytes_evidence("resident memory of the failing process", resident))
    return evidence


def _own_limit_evidence(trace: Trace, fail: Failure, own: Limit) -> list[Evidence]:
    """The failing process's own limit and what it counts (address space for RLIMIT_AS,
    resident memory for a cgroup), at the error."""
    if own.kind == "rlimit-as":
        label, used = "address space of the failing process", address_space_at_failure(trace, fail)
    else:
        label, used = "resident memory of the failing process", resident_at_failure(trace, fail)
    evidence = [bytes_evidence(own.label, own.limit_bytes)]
    if used is not None:
        evidence.append(bytes_evidence(label, used))
        evidence.append(share_evidence(f"{label} / its limit", used / own.limit_bytes))
    return evidence


def _pressure(trace: Trace) -> _Pressure | None:
    held = job_peak_resident(trace)
    limit = job_limit(trace)
    kills = trace.series(Metric.CGROUP_OOM_KILLS)
    rose = 0.0
    counted = kills is not None and len(kills) > 0
    if kills is not None and counted:
        rose = max(kills.values) - kills.values[0]
    if held is None and limit is None and kills is None:
        return None
    counted_label, counted_bytes = _counted(trace, limit, held.label if held else "")
    return _Pressure(
        held.held_bytes if held else None,
        limit.limit_bytes if limit else None,
        rose,
        peak_label=held.label if held else "peak resident memory of the job",
        limit_label=limit.label if limit else "memory limit",
        counted_label=counted_label,
        counted_bytes=counted_bytes,
        kills_counted=counted,
    )


_CGROUP_USAGE = "peak usage of the cgroup, every process in it counted"
_ADDRESS_SPACE = "peak address space of the capped process"
# What each counted quantity is called in a sentence.
_COUNTED_WORDS = {_CGROUP_USAGE: "cgroup usage", _ADDRESS_SPACE: "address space"}


def _counted(trace: Trace, limit: Limit | None, held_label: str) -> tuple[str, float | None]:
    """What the binding limit measures, when it is not the job's resident memory."""
    if limit is None:
        return "", None
    if limit.kind == "cgroup" and "cgroup" not in held_label:
        usage = trace.peak(Metric.CGROUP_USAGE)
        if usage is not None:
            return _CGROUP_USAGE, usage[1]
    if limit.kind == "rlimit-as":
        vms = trace.peak(Metric.HOST_VMS, None, root_pid(trace))
        if vms is not None:
            return _ADDRESS_SPACE, vms[1]
    return "", None


def _killed(trace: Trace) -> bool:
    if trace.exit is not None and trace.exit.signal == SIGKILL:
        return True
    return any(e.data.get("signal") == SIGKILL for e in trace.events(EventKind.PROCESS_EXIT))


def _several_processes(trace: Trace) -> bool:
    """More than one of the job's processes held host memory (workers, ranks, children)."""
    pids = {k.pid for k in trace.series_keys() if k.metric == Metric.HOST_RSS and k.pid}
    return len(pids) > 1


def _pressure_evidence(pressure: _Pressure, *, with_limit: bool = True) -> list[Evidence]:
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


RULE = HostOom()
