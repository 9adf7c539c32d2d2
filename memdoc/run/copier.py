"""Copies the program's stderr pipe to memdoc's own stderr in a process of its own, and a copy
to memdoc when memdoc can take it.

The program's output must never depend on memdoc staying alive: this process outlives a
killed memdoc and copies until the program's last writer closes the pipe. It is run by path
with `python -I -S` (standard library only): fd 0 is the program's pipe, fd 1 the real
stderr, and the descriptor named in argv[1] the copy to memdoc.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys

CHUNK_BYTES = 1 << 16
COPY_PIPE_BYTES = 1 << 20  # room for a whole BFC dump while memdoc is slow to read


def main(argv: list[str]) -> int:
    # Ctrl-C and a hang-up reach the whole process group: the program decides whether it
    # ends, and its last words still have to be copied.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    # Leave memdoc's children: its only child is the program, as without the copier.
    if os.fork() > 0:
        os._exit(0)
    copy_fd: int | None = int(argv[1]) if len(argv) > 1 else None
    if copy_fd is not None:
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(copy_fd, fcntl.F_SETPIPE_SZ, COPY_PIPE_BYTES)
        # memdoc stopped (SIGSTOP) or slow: drop its copy, never hold up the program.
        os.set_blocking(copy_fd, False)
    while True:
        try:
            data = os.read(0, CHUNK_BYTES)
        except InterruptedError:
            continue
        except OSError:
            return 0
        if not data:
            return 0
        if not _write_all(1, data):
            # The real stderr's reader is gone: end, so that the program sees a broken
            # pipe as it would without memdoc.
            return 0
        if copy_fd is not None and not _offer(copy_fd, data):
            with contextlib.suppress(OSError):
                os.close(copy_fd)
            copy_fd = None  # memdoc is gone; go on copying for the program


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except (InterruptedError, BlockingIOError):
            select.select([], [fd], [])
        except OSError:
            return False
    return True


def _offer(fd: int, data: bytes) -> bool:
    """Give memdoc what fits now; False once memdoc is gone."""
    try:
        os.write(fd, data)
    except BlockingIOError:
        pass  # memdoc is behind: this part of the tail is lost, the program is not held
    except OSError:
        return False
    return True


if __name__ == "__main__":
    with contextlib.suppress(BaseException):  # never a traceback on the program's stderr
        sys.exit(main(sys.argv))
