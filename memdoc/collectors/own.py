"""This process's own memory, read in-process in a few microseconds (Linux `/proc/self`)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from memdoc.kinds import StepReading

# statm's fields, in pages: size (address space), resident, shared (resident file and shared
# memory pages), text, lib, data, dt. Resident less shared is the anonymous memory the
# process owns, the kernel's RssAnon.
_STATM = "/proc/self/statm"
_STATM_FIELDS = 7


class _Statm:
    """/proc/self/statm, opened once per process: reading it again costs about 2 µs against
    15 µs to open it each time. A fork's child closes the descriptor it inherits and opens
    its own; a descriptor that fails, or reads as anything but statm, is dropped."""

    def __init__(self) -> None:
        self._pid = 0
        self._fd: int | None = None
        self._page = 0

    def pages(self) -> tuple[int, int, int] | None:
        """(address space, resident, shared) in bytes; None where statm cannot be read."""
        try:
            if self._fd is None or self._pid != os.getpid():
                self._pid, self._fd = os.getpid(), os.open(_STATM, os.O_RDONLY | os.O_CLOEXEC)
                self._page = self._page or os.sysconf("SC_PAGE_SIZE")
            fields = os.pread(self._fd, 128, 0).split()
            if len(fields) != _STATM_FIELDS:
                raise ValueError("not statm")
            return (
                int(fields[0]) * self._page,
                int(fields[1]) * self._page,
                int(fields[2]) * self._page,
            )
        except (OSError, ValueError, AttributeError):
            self._fd = None  # opened again next time: a program may close what it did not open
            return None

    def forget(self) -> None:
        """In a fork's child: close the parent's descriptor."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


_statm = _Statm()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_statm.forget)


def own_memory() -> dict[str, int]:
    """Resident bytes and address space in use of this process now; empty where
    `/proc/self/statm` cannot be read (not Linux, or failing at an OOM)."""
    pages = _statm.pages()
    if pages is None:
        return {}
    size, resident, _ = pages
    return {"address_space_bytes": size, "rss_bytes": resident}


def step_memory() -> dict[str, int]:
    """What a step boundary records of this process's own memory (`StepReading`):
    resident bytes and the anonymous part of them; empty where unreadable."""
    pages = _statm.pages()
    if pages is None:
        return {}
    _, resident, shared = pages
    return {
        StepReading.RSS: resident,
        StepReading.ANON: max(resident - shared, 0),
    }


def trim_heap() -> bool:
    """Hand the C heap's freed pages back to the system (glibc's `malloc_trim(0)`): what
    the program holds stays as it was, and the memory it owns is then what it holds, not
    what its allocator kept after freeing. About 1.5 ms in a process running JAX or
    TensorFlow. False where there is no glibc."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: a program memdoc watches pays nothing for it otherwise
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def heap_free() -> int | None:
    """Bytes the C heap holds freed, kept for later in its arenas (glibc's `mallinfo2`,
    about a microsecond): resident memory the program no longer holds. A framework's
    temporaries freed after an evaluation stay there, and the process looks larger than
    what it keeps. None without glibc 2.33."""
    read = _mallinfo2()
    if read is None:
        return None
    return int(read().fordblks)


@functools.cache
def _mallinfo2() -> Callable[[], Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        read = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    read.argtypes = []
    read.restype = Mallinfo2
    return read
