"""The registry of memdoc recordings running on this machine: one small file per recording."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memdoc.errors import MemdocError
from memdoc.files import write_atomically

ENV_RUNTIME_DIR = "XDG_RUNTIME_DIR"
# A process created after the recording started is another process that got its pid.
_PID_REUSE_SLACK_S = 1.0
_MAX_ENTRY_BYTES = 64 * 1024
_SUFFIX = ".json"
_claim_lock = threading.Lock()
# Entries this interpreter wrote and has not withdrawn, with the pid that wrote them (a
# forked child inherits the set: it withdraws none of its parent's).
_announced: dict[Path, int] = {}


@dataclass(frozen=True)
class Recording:
    """A `memdoc run` or `memdoc.watch` writing a trace now: its recording process and file."""

    pid: int
    trace_path: Path
    started_unix: float
    command: tuple[str, ...] = ()


def registry_dirs() -> list[Path]:
    """Where this user's recordings are announced, first choice first: the session's runtime
    folder when there is a writable one (private, cleared at logout), and a private folder in
    the temp folder. A batch job often has no runtime folder while a login shell has one, so
    readers look in both."""
    folders = []
    runtime = os.environ.get(ENV_RUNTIME_DIR)
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK):
        folders.append(Path(runtime) / "memdoc")
    folders.append(Path(tempfile.gettempdir()) / f"memdoc-{os.getuid()}")
    return folders


def register(
    trace_path: str | os.PathLike[str],
    command: Sequence[str],
    *,
    directory: Path | None = None,
    pid: int | None = None,
) -> Path | None:
    """Announce a recording by process `pid` (this one by default); return the entry to pass
    to `unregister` when it ends.

    Never raises: without a usable folder (read-only temp folder, one owned by another user)
    there is simply no entry, and None is returned.
    """
    recording = Recording(
        pid=pid if pid is not None else os.getpid(),
        trace_path=Path(os.path.abspath(trace_path)),
        started_unix=time.time(),
        command=tuple(command),
    )
    for folder in [directory] if directory is not None else registry_dirs():
        try:
            if not _private_folder(folder, create=True):
                continue
            with _claim_lock:
                entry = _free_name(folder, recording.pid)
                write_atomically(entry, _encode(recording))
                _announced[entry] = os.getpid()
            return entry
        except (OSError, ValueError, MemdocError):
            continue
    return None


def unregister(entry: Path | None) -> None:
    """Withdraw an entry `register` wrote (None: nothing was written). Never raises."""
    if entry is not None:
        _announced.pop(entry, None)
        with contextlib.suppress(OSError):
            entry.unlink()


@atexit.register
def _withdraw_at_exit() -> None:
    """A recording left open when the interpreter exits (a watch never exited, a fit whose
    error the program caught) is no longer running: its entry goes with the process."""
    for entry, pid in list(_announced.items()):
        if pid == os.getpid():
            unregister(entry)


def live_recordings(directory: Path | None = None) -> list[Recording]:
    """The recordings whose process still runs, oldest first; entries of ended ones are removed."""
    found: list[Recording] = []
    for folder in [directory] if directory is not None else registry_dirs():
        found.extend(_live_in(folder))
    return sorted(found, key=lambda r: (r.started_unix, r.pid))


def _live_in(folder: Path) -> list[Recording]:
    try:
        if not _private_folder(folder, create=False):
            return []
        entries = sorted(folder.glob("*" + _SUFFIX))
    except OSError:
        return []
    found: list[Recording] = []
    for entry in entries:
        recording = _read(entry)
        if recording is not None and _still_running(recording):
            found.append(recording)
        elif recording is not None or not _pid_runs(_pid_of_name(entry)):
            unregister(entry)  # ended, or damaged and its process gone
    return found


def _private_folder(folder: Path, *, create: bool) -> bool:
    """True when `folder` is a folder of this user that nobody else can write to.

    In a shared temp folder another user could have made it first, to show made-up entries.
    """
    if create:
        folder.mkdir(mode=0o700, parents=False, exist_ok=True)
    try:
        info = folder.lstat()
    except FileNotFoundError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _free_name(folder: Path, pid: int) -> Path:
    # Nested recordings in one process each get their own entry, named by the pid first.
    entry = folder / f"{pid}{_SUFFIX}"
    n = 1
    while entry.exists():
        entry = folder / f"{pid}-{n}{_SUFFIX}"
        n += 1
    return entry


def _encode(recording: Recording) -> str:
    return json.dumps(
        {
            "pid": recording.pid,
            "trace": str(recording.trace_path),
            "started_unix": recording.started_unix,
            "command": list(recording.command),
        }
    )


def _read(entry: Path) -> Recording | None:
    try:
        with open(entry, "rb") as stream:
            data = json.loads(stream.read(_MAX_ENTRY_BYTES))
        command = data.get("command") or []
        return Recording(
            pid=int(data["pid"]),
            trace_path=Path(str(data["trace"])),
            started_unix=float(data["started_unix"]),
            command=tuple(str(part) for part in command),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _pid_of_name(entry: Path) -> int | None:
    head = entry.name.removesuffix(_SUFFIX).split("-", 1)[0]
    return int(head) if head.isdigit() else None


# psutil is imported where a recording is checked, not with the module: memdoc.api imports
# this module in every process a `memdoc run` starts, which never lists recordings.
def _pid_runs(pid: int | None) -> bool:
    import psutil

    return pid is not None and psutil.pid_exists(pid)


def _still_running(recording: Recording) -> bool:
    import psutil

    try:
        created_unix = float(psutil.Process(recording.pid).create_time())
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # cannot tell: better shown than lost
    return created_unix <= recording.started_unix + _PID_REUSE_SLACK_S
