"""Copy the program's stderr through, byte for byte, keeping its tail to find memory errors in."""

from __future__ import annotations

import collections
import os
import stat
import threading

TAIL_BYTES = 1 << 20  # the end of the stream: where a BFC dump and the OOM line are


def same_file(fd_a: int, fd_b: int) -> bool:
    """True when two descriptors write to the same file (`> log 2>&1`, one terminal, one pipe)."""
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def should_tee(fd: int = 2) -> bool:
    """Tee only where the program would not notice: never a terminal (it would lose isatty
    and colours), only files and pipes."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return not os.isatty(fd) and (stat.S_ISREG(mode) or stat.S_ISFIFO(mode))


class StreamTee:
    """A pipe whose read end is copied to `target_fd` as it arrives; the last bytes are kept.

    The child writes to `write_fd`. When its stdout and stderr are the same file, both go
    through this one pipe, so their order is what the program wrote.
    """

    def __init__(self, target_fd: int, tail_bytes: int = TAIL_BYTES) -> None:
        self.target_fd = target_fd
        self.read_fd, self.write_fd = os.pipe()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._tail_bytes = tail_bytes
        self._thread = threading.Thread(target=self._copy, name="memdoc-stderr", daemon=True)

    def start(self) -> StreamTee:
        self._thread.start()
        return self

    def close_write_end(self) -> None:
        """The parent's copy of the write end; the child keeps its own."""
        os.close(self.write_fd)

    def join(self, timeout_s: float = 2.0) -> None:
        """Wait for the end of the stream (a grandchild may hold it open: then stop waiting)."""
        self._thread.join(timeout_s)

    def text(self) -> str:
        return b"".join(self._tail).decode("utf-8", errors="replace")

    def _copy(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 1 << 16)
            except OSError:
                break
            if not data:
                break
            self._write_through(data)
            self._keep(data)
        os.close(self.read_fd)

    def _write_through(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.target_fd, view)
            except InterruptedError:
                continue
            except OSError:
                return  # memdoc's own stderr is gone; the program must not block on it
            view = view[written:]

    def _keep(self, data: bytes) -> None:
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size - len(self._tail[0]) >= self._tail_bytes:
            self._tail_size -= len(self._tail.popleft())
