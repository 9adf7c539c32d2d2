"""Memory errors from any text: PyTorch, TensorFlow, JAX/XLA, disguised and host forms."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from memdoc.kinds import OomKind

if TYPE_CHECKING:
    from memdoc.oom.logtext import Hit, LogText
    from memdoc.trace.model import OomInfo

__all__ = ["looks_like_memory_error", "parse_all", "parse_text"]

# OomInfo.kind: "allocator" (a framework allocator's OOM, with its statistics where printed),
# "compile" (XLA buffer assignment or a TPU program that does not fit), "disguised" (cuDNN,
# cuBLAS, NCCL, driver or NVML failures that are OOMs in disguise; `library` says which),
# "host-kill" (SIGKILL, `Killed`, the kernel OOM killer), "host-alloc" (a host allocation
# failed: MemoryError, DefaultCPUAllocator, ENOMEM, bad_alloc), "shm" (/dev/shm full, bus
# error), "dataloader-killed" (a DataLoader worker died). Numbers stay as printed, even
# impossible ones (2^64 from NVML); `requested_unknown_huge` flags requests of 1 EiB or more.


@functools.cache
def _parsers() -> tuple[Callable[[LogText], list[Hit]], ...]:
    """The parsers, most specific first: where two read the same line, the earlier one wins.

    Imported on the first parse, not with the package: the agent in every process of a run
    reads memdoc.oom.names and parses nothing, and the parsers compile many patterns."""
    from memdoc.oom import bfc, disguised, headline, host, pytorch, tensorflow, xla

    return (
        pytorch.find,
        tensorflow.find,
        bfc.find,
        xla.find,
        disguised.find,
        host.find,
        disguised.find_fallback,
        headline.find,
    )


# A line that names an illegal memory access reports a kernel's fault, whatever wraps it
# (RMM turns a sticky cudaErrorIllegalAddress into std::bad_alloc): never a lack of memory.
_FAULT_WORDS = ("illegal memory access", "illegaladdress", "illegal address")


def _a_fault(log: LogText, hit: Hit) -> bool:
    """A wrapped failure (a disguised or host allocation error) whose line names a fault. A
    framework's own out-of-memory message never wraps one, so it is never dropped here."""
    if hit.info.kind not in (OomKind.DISGUISED, OomKind.HOST_ALLOC):
        return False
    return any(word in log.lower_head(hit.line, 2000) for word in _FAULT_WORDS)


# Kinds whose words ("Cannot allocate memory", ResourceExhaustedError) other limits share.
_SHARED_WORDS_KINDS = (OomKind.HOST_ALLOC, OomKind.SHM, OomKind.ALLOCATOR, OomKind.DISGUISED)


def _another_limit(log: LogText, hit: Hit) -> bool:
    """A failure whose own lines (and the two around them) name a limit that is not the
    memory's size: the locked-memory limit, the count of memory maps, a disk quota."""
    from memdoc.oom.lookalike import other_limit

    if hit.info.kind not in _SHARED_WORDS_KINDS:
        return False
    around = range(max(0, hit.line - 2), min(len(log.lines), max(hit.end, hit.line) + 3))
    return other_limit("\n".join(log.head(index, 2000) for index in around)) is not None


def parse_all(text: str) -> list[OomInfo]:
    """Every memory error in `text`, in order of appearance, echoes of one error merged."""
    from memdoc.oom.combine import combine
    from memdoc.oom.logtext import LogText

    if not isinstance(text, str):
        text = bytes(text).decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    try:
        log = LogText(text)
    except MemoryError:
        return []
    hits: list[Hit] = []
    for priority, parser in enumerate(_parsers()):
        try:
            found = parser(log)
        except Exception:  # one parser's bug must not hide the others' findings
            continue
        hits.extend(
            replace(hit, priority=priority)
            for hit in found
            if not _a_fault(log, hit) and not _another_limit(log, hit)
        )
    try:
        return combine(hits, log)
    except Exception:  # explain and the OOM hooks must never crash on a log
        return []


def parse_text(text: str) -> OomInfo | None:
    """The memory error that ended the log (the last one), or None when there is none."""
    found = parse_all(text)
    return found[-1] if found else None


def looks_like_memory_error(text: str) -> bool:
    """Whether `text` holds a memory error of any known form."""
    return bool(parse_all(text))
