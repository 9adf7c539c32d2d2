"""The parent's run folder (where the agents' socket lives), and the removal of those that a
killed parent left behind."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from memdoc.run.channel import connect_now

PREFIX = "memdoc-run-"
SOCKET_NAME = "agent.sock"
# The owning parent's PID is part of the name, so that a later run can tell a leftover
# (its parent is dead) from the folder of a run still going on.
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-")


# The longest path a Unix socket can be bound to (sun_path holds 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
# Where the run folder goes when the temporary folder's path is too long for the socket
# (a job's own TMPDIR deep in a scratch file system).
SHORT_ROOT = Path("/tmp")


def create_run_dir() -> Path:
    """A new private folder for this parent, named after its PID: in the temporary folder,
    or in SHORT_ROOT where the socket's path would be too long there."""
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    if len(os.fsencode(folder / SOCKET_NAME)) <= MAX_SOCKET_PATH or not SHORT_ROOT.is_dir():
        return folder
    with contextlib.suppress(OSError):
        folder.rmdir()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=SHORT_ROOT))


def remove_stale_run_dirs(root: Path | None = None) -> list[Path]:
    """Remove the run folders of this user whose parent is dead; never someone else's, never
    a live run's. Returns what was removed. Never raises: tidying up must not stop a run."""
    if root is not None:
        return _remove_stale_in(root)
    removed = _remove_stale_in(Path(tempfile.gettempdir()))
    if _socket_path_too_long(Path(tempfile.gettempdir())):
        removed += _remove_stale_in(SHORT_ROOT)
    return removed


def _socket_path_too_long(root: Path) -> bool:
    """Whether a run folder's socket in `root` could be too long (its PID as long as any)."""
    longest = root / f"{PREFIX}{'9' * 7}-{'x' * 8}" / SOCKET_NAME
    return len(os.fsencode(longest)) > MAX_SOCKET_PATH


def _remove_stale_in(folder: Path) -> list[Path]:
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or not _ours(entry):
            continue
        if _parent_alive(int(match.group(1)), entry) or _listening(Path(entry.path)):
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(entry.path)
            removed.append(Path(entry.path))
    return removed


def _ours(entry: os.DirEntry[str]) -> bool:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def _listening(folder: Path) -> bool:
    """True when a parent still listens on the folder's socket: a run in another PID
    namespace (containers sharing /tmp), whose PID means nothing here."""
    try:
        sock = connect_now(str(folder / SOCKET_NAME))
    except OSError:
        return False  # no socket, or nobody listens on it
    if sock is not None:  # None: its backlog is full, alive, just busy
        sock.close()
    return True


def _parent_alive(pid: int, entry: os.DirEntry[str]) -> bool:
    """True unless the PID is gone, a zombie, or a newer process that reused the PID."""
    import psutil  # here: the cleanup runs beside the program, not before it

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        born_s = float(process.create_time())
        made_s = float(entry.stat(follow_symlinks=False).st_mtime)
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True  # cannot tell: keep it
    # The folder is made after its parent started; a process born later reused the PID.
    # The folder's time changes as the socket is made in it, so it is a lower bound only.
    return born_s <= made_s + 1.0
