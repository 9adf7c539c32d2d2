"""A terminal's Ctrl-C, sent by hand: SIGINT to the program and its foreground processes."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def interrupt_like_a_terminal(pid: int) -> list[int]:
    """Send SIGINT to `pid`, a child of memdoc, and to every process below it in memdoc's
    process group.

    A terminal's Ctrl-C reaches the whole foreground process group; while the dashboard
    holds the terminal in raw mode the terminal sends nothing, so memdoc does it. Processes
    that left the group (daemons, `setsid`) are left alone, as a terminal would. Returns the
    PIDs that were sent the signal.
    """
    try:
        root = psutil.Process(pid)
        if root.ppid() != os.getpid():
            return []  # not our program any more: its PID was reused after it ended
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    group = os.getpgrp()
    sent: list[int] = []
    for proc in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if proc.pid != pid and os.getpgid(proc.pid) != group:
                continue
            os.kill(proc.pid, signal.SIGINT)
            sent.append(proc.pid)
    return sent
