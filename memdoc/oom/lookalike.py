"""Errors in memory's words that, in public threads, were mostly something else.

"Cannot allocate memory" (ENOMEM) and TensorFlow's ResourceExhaustedError also come from
limits that more memory would not lift: the locked-memory limit (`mlock`, RDMA verbs and UCX
registering buffers), the count of memory maps a process may hold (`vm.max_map_count`: a
mapping of a few pages refused) and a disk quota. Such errors were settled by raising that
limit, never by freeing memory. A bare `std::bad_alloc` (no size, nothing else about memory)
was thrown by damaged input, mismatched builds and library bugs far more often than by a full
host. Neither is read as a memory error from its text alone; `explain` says why.
"""

from __future__ import annotations

import re

from memdoc.kinds import OomKind
from memdoc.oom.fields import to_bytes
from memdoc.oom.patterns import compile_later
from memdoc.trace.model import OomInfo

# A mapping this small refused with ENOMEM is a limit on mappings, not a lack of memory.
TINY_MAPPING_BYTES = 64 * 1024

# RDMA verbs (`ibv_*`) failing with ENOMEM hit the locked-memory limit too (Docker's 64 MiB).
_LOCKED = compile_later(
    r"\bmlock\b|rlimit_mlock|ulimit -l\b|max locked memory|\bmemlock\b|\bibv_\w{2,40}\b",
    re.I,
)
_MAP_COUNT = compile_later(r"max_map_count", re.I)
_MAPPING = compile_later(
    r"\bmmap\s{1,4}(\d{1,20}(?:\.\d{1,4})?)\s{0,2}(bytes|[KMG]i?B)\b"
    r"|\bmap (\d{1,20}) bytes\b",
    re.I,
)
_QUOTA = compile_later(r"disk quota exceeded", re.I)

LOCKED_MEMORY = (
    "it names the locked-memory limit (`ulimit -l`, RLIMIT_MLOCK), not the memory's size: "
    "raise that limit (Docker: `--ulimit memlock=-1`) or turn memory locking off"
)
MAP_COUNT = (
    "a mapping of a few pages was refused: the process reached its limit on memory maps "
    "(`vm.max_map_count`; raise it with `sysctl -w vm.max_map_count=1048576`) or an "
    "address-space cap (`ulimit -v`), not the end of RAM"
)
QUOTA = "it names a disk quota, not memory: free disk space or write elsewhere"


def other_limit(text: str) -> str | None:
    """Why `text` fails on a limit that is not the memory's size, or None when it does not."""
    if _LOCKED.search(text):
        return LOCKED_MEMORY
    if _MAP_COUNT.search(text) or _tiny_mapping(text):
        return MAP_COUNT
    if _QUOTA.search(text):
        return QUOTA
    return None


def _tiny_mapping(text: str) -> bool:
    for match in _MAPPING.finditer(text):
        if match.group(3) is not None:
            size: float | None = float(match.group(3))
        elif match.group(2).lower() == "bytes":
            size = float(match.group(1))
        else:
            size = to_bytes(f"{match.group(1)} {match.group(2)}")
        if size is not None and 0 < size <= TINY_MAPPING_BYTES:
            return True
    return False


BARE_BAD_ALLOC = (
    "a C++ allocation failed (std::bad_alloc) without saying its size; in public threads this "
    "came from damaged or mismatched input files, builds that do not match and library bugs "
    "far more often than from a full host. If the host was near its memory limit when it "
    "failed, it was memory: run it under `memdoc run` to see"
)
# Words of the log around a bad_alloc that speak of memory running out, not of a bad size.
_MEMORY_SAID = compile_later(
    r"out of memory|out_of_memory|memory limit|not enough memory|cannot allocate memory"
    r"|\bkilled\b|\boom\b|memoryerror: (?!std::bad_alloc\s*$)",
    re.I,
)


def bare_bad_alloc(oom: OomInfo, text: str) -> bool:
    """A host allocation failure that is std::bad_alloc alone: no size, no device, and no
    word in the text of memory running out."""
    return (
        oom.kind == OomKind.HOST_ALLOC
        and oom.requested_bytes is None
        and "bad_alloc" in (oom.message or "")
        and _MEMORY_SAID.search(text) is None
    )
