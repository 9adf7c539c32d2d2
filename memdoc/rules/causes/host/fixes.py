"""The fixes host-oom offers, and which of them the evidence calls for."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from memdoc.kinds import OomKind
from memdoc.oom.hostcues import HostCues, Scheduler
from memdoc.rules.base import Fix
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.rules.host import in_data_loading, in_model_loading
from memdoc.rules.spec import snippet
from memdoc.trace.model import Metric

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
# The lines of the limit fix: the report of the trace, then the caps to compare it with.
_REPORT_COMMENT = "# which memory grew, and when"
_COMMENT_COLUMN = 34  # where the comments start, when the trace's name leaves room
_ULIMIT_LINE = (
    "ulimit -v                         # this shell's address-space cap (unlimited = none)"
)
_CGROUP_LINES = {
    2: "cat /sys/fs/cgroup/memory.max     # the container's limit (cgroup v2)",
    # memory.max does not exist where the memory cgroup is v1
    1: "cat /sys/fs/cgroup/memory/memory.limit_in_bytes   # the container's limit (cgroup v1)",
}
_EXAMPLE_TRACE = "run.memdoc"


def limit_fix(cgroup_version: int | None = None, trace_path: Path | None = None) -> Fix:
    """Find what grew and compare it with the caps: this trace's report, this cgroup's file."""
    name = _EXAMPLE_TRACE if trace_path is None else shlex.quote(str(trace_path))
    report = f"memdoc report {name}".ljust(_COMMENT_COLUMN - 1) + " " + _REPORT_COMMENT
    cgroup = _CGROUP_LINES[1 if cgroup_version == 1 else 2]
    return Fix(
        "any",
        "Find what grew, then shrink it or give the job more memory",
        "\n".join((report, _ULIMIT_LINE, cgroup)),
        "bash",
    )


LIMIT_FIX = limit_fix()


@dataclass(frozen=True)
class Signs:
    """What the evidence points at, so that only the fixes it calls for are offered."""

    killed: bool = False
    workers: bool = False
    shm: bool = False
    loading: bool = False
    scheduler: Scheduler | None = None
    building: bool = False  # a compiler was killed while building an extension

    def fixes(
        self, involved: list[str], cgroup_version: int | None, trace_path: Path | None = None
    ) -> tuple[Fix, ...]:
        return tuple(
            fix
            for fix, wanted in (
                (WORKERS_FIX, self.workers or self.shm),
                (SHM_FIX, self.shm),
                (LOADING_FIX, self.loading),
                (BUILD_FIX, self.building),
                (SLURM_FIX, self.scheduler == Scheduler.SLURM),
                (KUBERNETES_FIX, self.scheduler == Scheduler.KUBERNETES),
                (KILL_FIX, self.killed and self.scheduler is None),
                (TF_CACHE_FIX, "tensorflow" in involved),
                (limit_fix(cgroup_version, trace_path), True),
            )
            if wanted
        )


def error_signs(fail: Failure, cues: HostCues) -> Signs:
    """What a host error and the words around it point at."""
    oom = fail.oom
    dataloader = oom.kind == OomKind.DATALOADER_KILLED
    return Signs(
        killed=oom.kind in (OomKind.HOST_KILL, OomKind.DATALOADER_KILLED),
        workers=dataloader or cues.dataloader_worker or in_data_loading(fail),
        shm=oom.kind == OomKind.SHM
        or (dataloader and (cues.bus_error or cues.shared_memory_words)),
        loading=oom.phase == "load" or in_model_loading(fail),
        scheduler=cues.scheduler,
        building=oom.kind == OomKind.HOST_KILL and cues.compiler,
    )


def recorded_signs(facts: Facts, *, killed: bool) -> Signs:
    """What a recording without a host error points at: the kill, and the workers where
    more than one of the job's processes held host memory (workers, ranks, children)."""
    pids = {k.pid for k in facts.trace.series_keys() if k.metric == Metric.HOST_RSS and k.pid}
    return Signs(killed=killed, workers=len(pids) > 1)
