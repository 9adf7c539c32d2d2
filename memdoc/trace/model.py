"""The trace data model: plain frozen dataclasses in bytes and seconds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

FORMAT_NAME = "memdoc-trace"
SCHEMA_VERSION = 1

# Environment variables that change how memory behaves; only these reach a trace.
ENV_ALLOWLIST_PREFIXES = (
    "PYTORCH_",
    "XLA_",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "TF_GPU_",
    "TF_CPU_",
    "TF_CPP_",
    "TF_ENABLE_",
    "TF_XLA_",
    "TF_NUM_",
    "CUDA_",
    "NCCL_",
    "JAX_",
    "OMP_NUM_THREADS",
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NVIDIA_VISIBLE_DEVICES",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
)
# Variables that match a prefix above but can carry credentials.
_ENV_DENY_SUBSTRINGS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")


def allowlisted_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The memory-relevant part of an environment, never secrets."""
    kept: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_ALLOWLIST_PREFIXES):
            continue
        if any(bad in name.upper() for bad in _ENV_DENY_SUBSTRINGS):
            continue
        kept[name] = value[:1000]
    return dict(sorted(kept.items()))


class Metric:
    """Names of recorded series. Framework series are `<framework>.<quantity>`."""

    # Host, for the whole process tree (pid None) or one process (pid set).
    HOST_RSS = "host.rss"
    HOST_AVAILABLE = "host.available"
    HOST_TOTAL = "host.total"
    HOST_SWAP_USED = "host.swap_used"
    HOST_RLIMIT_AS = "host.rlimit_as"  # a process's address-space cap (RLIMIT_AS), when set
    HOST_VMS = "host.vms"  # a process's address space in use: what RLIMIT_AS counts
    CGROUP_USAGE = "cgroup.usage"
    CGROUP_LIMIT = "cgroup.limit"
    CGROUP_OOM_KILLS = "cgroup.oom_kills"
    # Driver view (NVML), per device; GPU_PROC_USED per device and pid.
    GPU_USED = "gpu.used"
    GPU_FREE = "gpu.free"
    GPU_TOTAL = "gpu.total"
    GPU_PROC_USED = "gpu.proc_used"
    # Framework quantities: the framework prefix comes from FRAMEWORK_PREFIXES.
    ALLOCATED = "allocated"
    ALLOCATED_PEAK = "allocated_peak"  # interval peak: highest value since the previous sample
    RESERVED = "reserved"
    RESERVED_PEAK = "reserved_peak"
    ACTIVE = "active"
    INACTIVE_SPLIT = "inactive_split"
    LIMIT = "limit"
    LARGEST_FREE = "largest_free"
    ALLOC_RETRIES = "num_alloc_retries"
    NUM_OOMS = "num_ooms"
    PRIVATE_POOL = "private_pool"


# Framework name as used in events and the JSON contract -> series prefix.
FRAMEWORK_PREFIXES: dict[str, str] = {"pytorch": "torch", "tensorflow": "tf", "jax": "jax"}
# Framework name -> how people write it.
FRAMEWORK_NAMES: dict[str, str] = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX"}


def framework_metric(framework: str, quantity: str) -> str:
    """`framework_metric("pytorch", Metric.ALLOCATED)` -> "torch.allocated"."""
    return f"{FRAMEWORK_PREFIXES.get(framework, framework)}.{quantity}"


class EventKind:
    """Kinds of event records."""

    MARK = "mark"
    STEP = "step"
    EXCEPTION = "exception"
    OOM = "oom"
    OOM_SUSPECT = "oom_suspect"
    PROCESS_START = "process_start"
    PROCESS_EXIT = "process_exit"
    FRAMEWORK = "framework"  # a framework was imported (data: name, version)
    ALLOCATOR_CONFIG = "allocator_config"
    MODEL_STATE = "model_state"  # parameter / gradient / optimizer-state bytes
    SNAPSHOT = "snapshot"  # an allocation snapshot saved beside the trace
    FORECAST = "forecast"  # when the per-step peak will cross its limit (memdoc.forecast)
    STOP = "stop"  # memdoc ended the run after the steps it was asked for (headroom)
    NOTE = "note"


@dataclass(frozen=True)
class SeriesKey:
    """Identifies one recorded series: a metric, on a device, for a process."""

    metric: str
    device: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class Event:
    """Something that happened at `t` seconds after the trace started."""

    t: float
    kind: str
    pid: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceInfo:
    """A GPU as the driver describes it. MIG instances have `parent_index` set."""

    index: int
    name: str
    total_bytes: int | None = None
    uuid: str | None = None
    parent_index: int | None = None
    driver_version: str | None = None


@dataclass(frozen=True)
class ProcessInfo:
    """A process of the run (ours) or another one seen on a device."""

    pid: int
    t: float
    ppid: int | None = None
    command: tuple[str, ...] = ()
    ours: bool = True
    user: str | None = None
    # Distributed launchers (torchrun, SLURM) tell each process its rank through the
    # environment; the agent records it so rules can tell rank 3 on GPU 0 from rank 0.
    rank: int | None = None
    local_rank: int | None = None


@dataclass(frozen=True)
class CollectorStatus:
    """Whether a collector works here, and if not why and what to do."""

    name: str
    available: bool
    t: float = 0.0
    pid: int | None = None
    reason: str | None = None
    hint: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class ExitInfo:
    """How the watched program ended."""

    t: float
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None

    @property
    def status(self) -> int | None:
        """The shell's view: the exit code, or 128+N for signal N."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code


@dataclass(frozen=True)
class Header:
    """The first record of a trace."""

    version: int
    created_unix: float
    memdoc_version: str
    command: tuple[str, ...] = ()
    host: str | None = None
    pid: int | None = None
    cwd: str | None = None
    python: str | None = None
    interval_s: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    rank: int | None = None
    world_size: int | None = None
    mode: str = "run"  # run | watch | import


@dataclass(frozen=True)
class ProcessUsage:
    """One 'Process N has X memory in use' entry of an OOM message."""

    pid: int | None
    used_bytes: int | None
    this_process: bool = False


@dataclass(frozen=True)
class OomInfo:
    """A memory error, parsed from its text or captured when it happened.

    Field names follow the JSON contract of `memdoc explain`; None means unknown.
    """

    framework: str = "unknown"
    kind: str = "allocator"
    message: str = ""
    device: int | None = None
    device_type: str | None = None  # "gpu", "cpu", "tpu"
    requested_bytes: int | None = None
    requested_unknown_huge: bool = False  # "more than 1EB", 2^64 sentinel
    total_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    private_pool_bytes: int | None = None
    this_process_bytes: int | None = None
    limit_bytes: int | None = None  # a configured cap ("X allowed", memory fraction)
    processes: tuple[ProcessUsage, ...] = ()
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    op: str | None = None
    allocator: str | None = None
    hint: str | None = None
    # TensorFlow BFC allocator dump statistics.
    bfc_in_use_bytes: int | None = None
    bfc_limit_bytes: int | None = None
    bfc_max_in_use_bytes: int | None = None
    bfc_largest_free_block_bytes: int | None = None
    bfc_num_allocs: int | None = None
    bfc_bins: tuple[tuple[int, int, int], ...] = ()  # (bin size, chunks in use, bytes in use)
    # XLA buffer assignment.
    xla_program: str | None = None
    xla_buffers: tuple[tuple[str, int], ...] = ()  # (description, bytes), largest first
    xla_temp_bytes: int | None = None
    # Context: the operation or library that failed, e.g. "cudnn", "cublas", "nccl".
    library: str | None = None
    phase: str | None = None  # "load", "eval", "train", "compile", when the text tells
    rank: int | None = None
    line: int | None = None  # 1-based line in the log where the error starts

    def to_dict(self) -> dict[str, Any]:
        """The `oom` object of the JSON contract: known values only."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == () or (f.name == "requested_unknown_huge" and not value):
                continue
            if f.name == "processes":
                value = [asdict(p) for p in value]
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OomInfo:
        """Inverse of `to_dict`; unknown keys are ignored (newer writers)."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, raw in data.items():
            if name not in known:
                continue
            value: Any = raw
            if name == "processes":
                value = tuple(
                    ProcessUsage(
                        pid=p.get("pid"),
                        used_bytes=p.get("used_bytes"),
                        this_process=bool(p.get("this_process", False)),
                    )
                    for p in raw
                    if isinstance(p, Mapping)
                )
            elif name == "shape" and raw is not None:
                value = tuple(int(v) for v in raw)
            elif name in ("bfc_bins", "xla_buffers"):
                value = tuple(tuple(v) for v in raw)
            kwargs[name] = value
        return cls(**kwargs)
