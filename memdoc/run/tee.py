"""Keeps the tail of the program's stderr, to find memory errors in, without standing between
the program and its stderr: the program's output never depends on memdoc staying alive."""

from __future__ import annotations

import collections
import contextlib
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

TAIL_BYTES = 1 << 20  # the end of the stream: where a BFC dump and the OOM line are
COPIER = str(Path(__file__).resolve().parent / "copier.py")


class StderrTail(Protocol):
    """Where the program's stdout and stderr go (None: memdoc's own, inherited), and the end
    of what it wrote to stderr once it is done."""

    stdout_fd: int | None
    stderr_fd: int | None

    def program_started(self) -> None:
        """The program holds its descriptors now: memdoc lets go of its copies and starts
        reading (call it with the forwarded signals blocked: it may start a thread)."""

    def text(self, wait_s: float = 2.0) -> str:
        """The last TAIL_BYTES the program wrote (waiting at most `wait_s` for the end)."""


def same_file(fd_a: int, fd_b: int) -> bool:
    """True when two descriptors write to the same file (`> log 2>&1`, one terminal, one pipe)."""
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def stderr_tail(fd: int = 2) -> StderrTail | None:
    """How to keep the tail of `fd` as the program writes it, or None where memdoc does not
    (a terminal keeps its isatty and colours, a device is left alone)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    if os.isatty(fd):
        return None
    if stat.S_ISREG(mode):
        return FileTail(fd)
    if stat.S_ISFIFO(mode):
        return PipeTail.start(fd)
    return None  # a socket (a journal, a log collector) keeps its own message boundaries


class FileTail:
    """A file: the program writes to it directly; its end is read back from the file."""

    def __init__(self, fd: int) -> None:
        self.stdout_fd: int | None = None
        self.stderr_fd: int | None = None
        self._fd = fd
        self._start_bytes = os.fstat(fd).st_size

    def program_started(self) -> None:
        pass

    def text(self, wait_s: float = 2.0) -> str:
        try:
            reader = os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY)
        except OSError:
            return ""  # opened write-only by someone who may not read it: no tail
        try:
            end = os.fstat(reader).st_size
            begin = max(self._start_bytes, end - TAIL_BYTES)
            data = os.pread(reader, max(0, end - begin), begin) if end > begin else b""
        except OSError:
            data = b""
        finally:
            os.close(reader)
        return data.decode("utf-8", errors="replace")


class PipeTail:
    """A pipe: the program writes into a pipe of its own, which a copier process (not
    memdoc) copies to the real one. The copier outlives a killed memdoc; memdoc reads a copy
    when it can, and a stopped memdoc never holds the program up."""

    def __init__(
        self, write_fd: int, copy_fd: int, copier: subprocess.Popen[bytes] | None = None
    ) -> None:
        self._copier = copier
        self.stdout_fd: int | None = write_fd if same_file(1, 2) else None
        self.stderr_fd: int | None = write_fd
        self._copy_fd = copy_fd
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._thread = threading.Thread(target=self._read, name="memdoc-stderr", daemon=True)

    @classmethod
    def start(cls, target_fd: int) -> PipeTail | None:
        """Start the copier to `target_fd`; None when it cannot start (no capture then)."""
        program_read, program_write = os.pipe()
        copy_read, copy_write = os.pipe()
        try:
            copier = subprocess.Popen(
                [sys.executable, "-I", "-S", COPIER, str(copy_write)],
                stdin=program_read,
                stdout=target_fd,
                pass_fds=(copy_write,),
            )
        except OSError:
            for fd in (program_read, program_write, copy_read, copy_write):
                os.close(fd)
            return None
        os.close(program_read)
        os.close(copy_write)
        return cls(program_write, copy_read, copier)

    def program_started(self) -> None:
        # The copier forks off and its first process ends at once, so that memdoc's only
        # child is the program (tools that look for it find it). It is reaped here, once
        # the program runs: waiting for it first held the program's start up by a Python's
        # start (some 40 ms).
        copier, self._copier = self._copier, None
        if copier is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                copier.wait(timeout=5.0)
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)  # the program's copy is its own; EOF comes when it ends
            self.stderr_fd = self.stdout_fd = None
            self._thread.start()

    def text(self, wait_s: float = 2.0) -> str:
        # The copy ends when the copier does, once every writer closed the program's pipe;
        # a grandchild may hold it open: then stop waiting, the copier goes on.
        if self._thread.is_alive():
            self._thread.join(wait_s)
        return b"".join(list(self._tail)).decode("utf-8", errors="replace")

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._copy_fd, 1 << 16)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            self._keep(data)
        os.close(self._copy_fd)

    def _keep(self, data: bytes) -> None:
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size - len(self._tail[0]) >= TAIL_BYTES:
            self._tail_size -= len(self._tail.popleft())
