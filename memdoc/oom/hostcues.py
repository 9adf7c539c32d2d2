"""What the words around a host memory failure say: who stopped it, where, and what ran out."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from memdoc.kinds import OomKind
from memdoc.oom.patterns import Pattern, compile_later


class Killer(str, Enum):
    """Whose words say that the job ran out of memory and was stopped."""

    KERNEL = "kernel"  # the kernel's OOM killer, in its own log lines or as containers report it
    PLATFORM = "platform"  # a scheduler, a cluster or a hosted notebook, in its notice


class Scheduler(str, Enum):
    """The job scheduler whose limit stopped the job, where the text names one."""

    SLURM = "slurm"
    KUBERNETES = "kubernetes"


class WorkerEnd(str, Enum):
    """The signal a DataLoader worker died of, as PyTorch reports it."""

    KILLED = "killed"  # SIGKILL: usually the OOM killer
    TERMINATED = "terminated"  # SIGTERM: rarely a memory problem


# What platforms say when a job ran out of host memory, as (needle, kind): hosted notebooks
# (Colab, Kaggle), schedulers and clusters (SLURM, Kubernetes, Ray, Dask), SageMaker,
# Windows' commit limit, Python itself, and Ollama refusing a model larger than the free RAM.
PLATFORM_NOTICES = (
    ("session crashed after using all available ram", OomKind.HOST_KILL),
    ("tried to allocate more memory than is available", OomKind.HOST_KILL),
    ("exceeded job memory limit", OomKind.HOST_KILL),
    ("exceeded memory limit", OomKind.HOST_KILL),
    ("oom-kill event", OomKind.HOST_KILL),
    ("use an instance type with more memory", OomKind.HOST_KILL),
    ("the node was low on resource: memory", OomKind.HOST_KILL),  # a Kubernetes eviction
    ("killed due to the node running low on memory", OomKind.HOST_KILL),  # Ray's memory monitor
    ("memory budget. restarting", OomKind.HOST_KILL),  # a Dask worker's nanny
    ("the paging file is too small", OomKind.HOST_ALLOC),
    ("cannot recover from memoryerrors", OomKind.HOST_ALLOC),
    ("requires more system memory", OomKind.HOST_ALLOC),
)

# Who stopped the job, as (pattern, killer); the kernel's words weigh first wherever they are.
KILLERS: tuple[tuple[str, Killer], ...] = (
    # dmesg and journalctl: "Out of memory: Killed process 1234 (python)", "oom-kill:...",
    # "oom_kill_process", "Memory cgroup out of memory: Killed process ..."
    (r"Out of memory: Kill|oom-kill|oom_kill|Killed process \d+", Killer.KERNEL),
    (r"Memory cgroup out of memory", Killer.KERNEL),
    (r"OOMKilled", Killer.KERNEL),  # Kubernetes and Docker naming the kernel's kill
    *(
        (re.escape(needle), Killer.PLATFORM)
        for needle, kind in PLATFORM_NOTICES
        if kind == OomKind.HOST_KILL
    ),
    # a scheduler's "OOM killed" (runc's "container init was OOM-killed" reads as the
    # kernel's, by "oom-kill")
    (r"OOM[- ]killed", Killer.PLATFORM),
)

# The scheduler a text names, as (pattern, scheduler): its daemons, commands and words.
SCHEDULERS: tuple[tuple[str, Scheduler], ...] = (
    (r"slurmstepd|\bslurm\b|\bsbatch\b|\bsrun\b", Scheduler.SLURM),
    # kubectl's "OOMKilled", the kubelet's eviction "low on resource: memory", runc's words
    (
        r"OOMKilled|kubelet|kubectl|container init was OOM-killed|low on resource",
        Scheduler.KUBERNETES,
    ),
)

# A compiler the kernel killed: an extension built with too many parallel jobs (gcc's
# cc1plus, nvcc and its cicc, ninja running them).
COMPILERS = r"cc1plus|\bcicc\b|\bnvcc\b|\bninja\b"

# Shared memory by name: the words, the mount, and PyTorch's segments ("/torch_1234_...").
SHARED_MEMORY = r"shared memory|/dev/shm|\bshm\b|torch_\d"
# The words shared memory is reported in for certain: no other memory is called so.
SHARED_MEMORY_WORDS = r"shared memory|/dev/shm"
BUS_ERROR = r"Bus error"
# Workers that share memory with the main process (DataLoader workers and others).
WORKERS = r"DataLoader|worker"
DATALOADER_WORKER = r"DataLoader worker"

# The words of a failure that is the host's by what it names: its allocator, RAM, an errno.
HOST_NAMED = (
    r"\bcpu|host|\bram\b|system memory|swap|malloc|calloc|MemoryError|bad_alloc|mmap|errno"
    r"|cannot allocate memory|insufficient memory|not enough memory|can't allocate region"
    r"|java\.lang|paging file|memory limit|oom-kill|numpy"
)
BAD_ALLOC = r"std::bad_alloc"

# How PyTorch reports a worker's end: "DataLoader worker (pid 123) is killed by signal: Killed."
WORKER_ENDS: tuple[tuple[str, WorkerEnd], ...] = (
    (r"signal: Killed", WorkerEnd.KILLED),
    (r"signal: Terminated", WorkerEnd.TERMINATED),
)


@dataclass(frozen=True)
class HostCues:
    """What the words around a host memory failure say, each read from its own table."""

    killed_by: Killer | None = None
    scheduler: Scheduler | None = None
    compiler: bool = False  # a compiler runs in it: an extension was being built
    bus_error: bool = False
    shared_memory: bool = False  # shared memory named: the words, the mount or a segment
    shared_memory_words: bool = False  # "shared memory" or "/dev/shm" said outright
    workers: bool = False  # workers named, DataLoader's or others
    dataloader_worker: bool = False  # "DataLoader worker" said
    names_host: bool = False  # the host's memory named: RAM, its allocator, an errno
    bad_alloc: bool = False  # C++'s std::bad_alloc
    worker_end: WorkerEnd | None = None


def _pattern(text: str) -> Pattern:
    return compile_later(text, re.IGNORECASE)


_KILLERS = tuple((_pattern(pattern), killer) for pattern, killer in KILLERS)
_SCHEDULERS = tuple((_pattern(pattern), scheduler) for pattern, scheduler in SCHEDULERS)
_WORKER_ENDS = tuple((_pattern(pattern), end) for pattern, end in WORKER_ENDS)
_COMPILERS = _pattern(COMPILERS)
_BUS_ERROR = _pattern(BUS_ERROR)
_SHARED_MEMORY = _pattern(SHARED_MEMORY)
_SHARED_MEMORY_WORDS = _pattern(SHARED_MEMORY_WORDS)
_WORKERS = _pattern(WORKERS)
_DATALOADER_WORKER = _pattern(DATALOADER_WORKER)
_HOST_NAMED = _pattern(HOST_NAMED)
_BAD_ALLOC = _pattern(BAD_ALLOC)
_T = TypeVar("_T")


def host_cues(texts: Iterable[str]) -> HostCues:
    """The cues in `texts` (an error's message, the log around it, its traceback's code)."""
    said = tuple(text for text in texts if text)
    return HostCues(
        killed_by=_first(_KILLERS, said),
        scheduler=_first(_SCHEDULERS, said),
        worker_end=_first(_WORKER_ENDS, said),
        compiler=_any(_COMPILERS, said),
        bus_error=_any(_BUS_ERROR, said),
        shared_memory=_any(_SHARED_MEMORY, said),
        shared_memory_words=_any(_SHARED_MEMORY_WORDS, said),
        workers=_any(_WORKERS, said),
        dataloader_worker=_any(_DATALOADER_WORKER, said),
        names_host=_any(_HOST_NAMED, said),
        bad_alloc=_any(_BAD_ALLOC, said),
    )


def _any(pattern: Pattern, texts: tuple[str, ...]) -> bool:
    return any(pattern.search(text) for text in texts)


def _first(table: tuple[tuple[Pattern, _T], ...], texts: tuple[str, ...]) -> _T | None:
    """The value of the table's first row that any of the texts matches."""
    return next((value for pattern, value in table if _any(pattern, texts)), None)
