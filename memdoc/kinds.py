"""The kinds memdoc sorts what ran out, and what a limit counts, into: named once here, in
a module that imports nothing, so that any layer (the command line's start included) can
use them."""

from __future__ import annotations


class OomKind:
    """What ran out, as the recogniser decides it from the error (`OomInfo.kind`)."""

    ALLOCATOR = "allocator"  # a framework's allocator refused a request on its device
    COMPILE = "compile"  # XLA's buffer assignment, or a TPU program, did not fit
    DISGUISED = "disguised"  # a library's handle or workspace (cuDNN, cuBLAS, NCCL) failed
    HOST_ALLOC = "host-alloc"  # a host allocation failed (MemoryError, bad_alloc, ENOMEM)
    HOST_KILL = "host-kill"  # killed (SIGKILL, `Killed`, the kernel's OOM killer)
    SHM = "shm"  # /dev/shm full (a bus error in a worker)
    DATALOADER_KILLED = "dataloader-killed"  # a DataLoader worker died


class LimitKind:
    """What a host limit counts."""

    RLIMIT_AS = "rlimit-as"  # a process's address space, against its RLIMIT_AS
    CGROUP = "cgroup"  # the cgroup's charged memory (resident and page cache)
    RAM = "ram"  # the machine's memory


class StepReading:
    """What a step event records of its process's own memory at the boundary: the keys of
    its data (the reader maps each to the host metric it is a reading of)."""

    RSS = "host_rss_bytes"  # resident bytes
    ANON = "host_anon_bytes"  # resident less file and shared pages (the kernel's RssAnon)


class GraphsKept:
    """The keys of an `autograd` event's data: the first backward pass that kept its graph
    (retain_graph=True), named by the program's line that called it; the first later one
    that freed a graph."""

    RETAINED = "retained_at"
    FREED = "freed_after_retaining"


# Which exceptions can be memory errors, by type, before any text is read: type names
# (anywhere in the class's bases) that a memory error can have: Python's own,
# PyTorch's (CPU allocator failures are plain RuntimeErrors), TensorFlow's and XLA's.
MEMORY_ERROR_TYPES = frozenset(
    {
        "MemoryError",
        "RuntimeError",
        "OutOfMemoryError",
        "ResourceExhaustedError",
        "XlaRuntimeError",
        "JaxRuntimeError",
        "InternalError",
    }
)


def could_be_memory_error(exc: BaseException) -> bool:
    """A cheap test before the message is parsed: most caught exceptions are not."""
    return any(cls.__name__ in MEMORY_ERROR_TYPES for cls in type(exc).__mro__)
