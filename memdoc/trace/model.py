"""The trace data model: plain frozen dataclasses in bytes and seconds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from memdoc.kinds import OomKind, StepReading

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
    # Resident memory of the program's own (anonymous pages: heap, tensors, arrays), without
    # the file pages that RSS also counts (mapped libraries, memory-mapped data files).
    HOST_ANON = "host.anon"
    HOST_AVAILABLE = "host.available"
    HOST_TOTAL = "host.total"
    HOST_SWAP_USED = "host.swap_used"
    HOST_RLIMIT_AS = "host.rlimit_as"  # a process's address-space cap (RLIMIT_AS), when set
    HOST_VMS = "host.vms"  # a process's address space in use: what RLIMIT_AS counts
    CGROUP_USAGE = "cgroup.usage"
    CGROUP_LIMIT = "cgroup.limit"
    CGROUP_OOM_KILLS = "cgroup.oom_kills"
    # Processes in the job's cgroup that are not the job's (0: the job has it to itself).
    CGROUP_OTHER_PROCESSES = "cgroup.other_processes"
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
# Keras runs on any of the three: a fix in its API is named for it, not for its backend.
KERAS = "keras"
# Frameworks an error text can name that memdoc does not watch (OomInfo.framework values).
UNWATCHED_FRAMEWORK_NAMES: dict[str, str] = {
    "torch7": "Torch7",
    "caffe": "Caffe",
    "mxnet": "MXNet",
    "darknet": "Darknet",
}


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
    AUTOGRAD = "autograd"  # a backward pass that kept its graph, and a later one that freed
    SNAPSHOT = "snapshot"  # an allocation snapshot saved beside the trace
    FORECAST = "forecast"  # when the per-step peak will cross its limit (memdoc.forecast)
    STOP = "stop"  # memdoc ended the run after the steps it was asked for (headroom)
    NOTE = "note"
    # The job's memory cgroup, and the cgroup whose limit is the tightest above it.
    CGROUP = "cgroup"
    LOSS = "loss"  # an agent dropped samples/events while memdoc could not keep up


# A step event's `source` when the program marked it (`memdoc.step()`, `w.step()`): such
# steps win over the ones detected automatically (e.g. "optimizer") in the same process.
USER_STEP = "user"

# What a step event records of its process's own memory at the boundary (resident bytes,
# and the anonymous part of them), by the host metric each one is a reading of.
STEP_HOST_READINGS = {Metric.HOST_ANON: StepReading.ANON, Metric.HOST_RSS: StepReading.RSS}

# An end record's `reason` when an exception left a `memdoc.watch` block: the program may
# still catch it, so the record carries no exit code.
RAISED_OUT_OF_WATCH = "raised out of the watched block"
# An OOM event's flag: the program raised its next error while still handling this one (a
# retry inside its `except` block), which kept this one's traceback, and its frames, alive.
HANDLED_WHEN_RAISED = "handled_when_next_raised"


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

    @property
    def is_phase_mark(self) -> bool:
        """A mark a loop writes where one of its phases (train, eval, ...) begins or ends."""
        return self.kind == EventKind.MARK and "phase" in self.data


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
class Loss:
    """Samples and events an agent dropped between `start_s` and `end_s` (seconds since the
    trace started) because memdoc could not keep up (stopped, swapped out, too slow)."""

    pid: int | None
    start_s: float
    end_s: float
    samples: int
    events: int


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
    cgroup_version: int | None = None  # of the recording process's memory cgroup: 1, 2, none
    # The launcher's node (torchrun --node-rank, SLURM_NODEID) when one recording covers the
    # ranks of one node of a job on many.
    node_rank: int | None = None
    # The job every node's recording shares, as its launcher names it (a SLURM job and step,
    # torchrun's --rdzv-id, MEMDOC_JOB_ID); None where none names it, and in older traces.
    run_id: str | None = None


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
    kind: str = OomKind.ALLOCATOR
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
    xla_total_bytes: int | None = None  # every buffer of the program together
    xla_parameter_bytes: int | None = None  # its inputs
    xla_output_bytes: int | None = None  # what it returns ("maybe_live_out")
    source: str | None = None  # "file:line" of the failing op, when the text names it
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
        """Inverse of `to_dict`; unknown keys are ignored (newer writers), and so is a value
        of another type than its field's (a damaged or hostile trace): it reads as unknown."""
        declared = {f.name: str(f.type) for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, raw in data.items():
            if name not in declared:
                continue
            try:
                kwargs[name] = _field_value(name, declared[name], raw)
            except (TypeError, ValueError):
                continue
        return cls(**kwargs)


def _is_int(value: Any) -> bool:
    """A whole number as large as an error text can print one: parsed figures stay as
    printed, impossible ones included (2^64 - 1 from NVML, a 30-digit run)."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**128


def _int(value: Any) -> int:
    if not _is_int(value):
        raise ValueError("not an integer")
    return int(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else _int(value)


def _field_value(name: str, declared: str, raw: Any) -> Any:
    """`raw` as the field `name` of an `OomInfo` holds it.

    Raises:
        ValueError, TypeError: `raw` is not of the field's type.
    """
    if name == "processes":
        return tuple(
            ProcessUsage(
                pid=_int_or_none(p.get("pid")),
                used_bytes=_int_or_none(p.get("used_bytes")),
                this_process=p.get("this_process") is True,
            )
            for p in raw
            if isinstance(p, Mapping)
        )
    if name == "shape":
        return None if raw is None else tuple(_int(v) for v in raw)
    if name == "bfc_bins":
        return tuple((_int(size), _int(chunks), _int(used)) for size, chunks, used in raw)
    if name == "xla_buffers":
        return tuple((str(what), _int(size)) for what, size in raw)
    base = declared.removesuffix(" | None")
    if raw is None:
        if base == declared:
            raise ValueError(f"{name} is missing")
        return None
    if base == "int":
        return _int(raw)
    if base == "str" and not isinstance(raw, str):
        raise TypeError(f"{name} is not a string")
    if base == "bool" and not isinstance(raw, bool):
        raise TypeError(f"{name} is not true or false")
    return raw
