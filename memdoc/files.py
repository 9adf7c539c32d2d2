"""Writing output files safely: whole (a temporary file renamed into place), never through a
link that another user planted, never over a file without being asked to."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from memdoc.errors import InputError, MemdocError, OutputExistsError

# Opening never follows a link at the last component (O_NOFOLLOW is POSIX; absent on Windows).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NAME_TRIES = 100


def refuse_foreign_link(path: Path) -> None:
    """Refuse an output path that is a symbolic link owned by another user.

    In a shared folder such a link aims memdoc's output at a file of the link's choosing.

    Raises:
        MemdocError: `path` is a symbolic link and another user owns it.
    """
    try:
        info = path.lstat()
    except OSError:
        return  # nothing there (or unreadable: opening will say so)
    if not path.is_symlink():
        return
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise MemdocError(
            f"{path} is a symbolic link owned by another user; not writing through it",
            hint="remove the link, or choose another path with -o",
        )


def open_output_text(path: Path, *, force: bool) -> IO[str]:
    """`open_output`, for UTF-8 text."""
    return os.fdopen(_create(path, force=force), "w", encoding="utf-8", buffering=1 << 16)


def open_output(path: Path, *, force: bool) -> IO[bytes]:
    """Create `path` for writing, exclusively: an existing file is an error unless `force`,
    and then it is removed first, so that a link there is replaced, never followed.

    Raises:
        OutputExistsError: `path` exists and `force` is false.
        MemdocError: the path is a link another user owns, or it cannot be created.
    """
    return os.fdopen(_create(path, force=force), "wb")


def _create(path: Path, *, force: bool) -> int:
    """A file descriptor of `path`, newly created (see `open_output`).

    Raises:
        OutputExistsError: `path` exists and `force` is false.
        MemdocError: the path is a link another user owns, or it cannot be created.
    """
    refuse_foreign_link(path)
    if force:
        try:
            if path.is_symlink() or path.is_file():
                path.unlink()
        except OSError as exc:
            raise MemdocError(f"cannot write {path}: {exc.strerror or exc}") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        return os.open(path, flags, 0o666)
    except FileExistsError:
        raise OutputExistsError(str(path)) from None
    except OSError as exc:
        raise MemdocError(f"cannot write {path}: {exc.strerror or exc}") from None


def temporary_beside(path: Path) -> tuple[int, Path]:
    """A new file in `path`'s folder, with a random name, created exclusively (never through
    a link), as `tempfile.mkstemp` does but with the mode any new file gets (umask applies).

    Raises:
        MemdocError: the folder does not exist or cannot be written.
    """
    folder = path.parent if str(path.parent) else Path(".")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    for _ in range(_NAME_TRIES):
        tmp = folder / f".{path.name}.{os.urandom(8).hex()}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue  # taken (by chance, or planted): draw another name
        except OSError as exc:
            raise MemdocError(f"cannot write {path}: {exc.strerror or exc}") from None
    raise MemdocError(f"cannot write {path}: no free temporary name in {folder}")


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write to a new temporary file beside `path`, then rename: readers never see a partial
    file, and a link at `path` is replaced rather than followed.

    Raises:
        MemdocError: the folder is not writable, the disk is full, or `path` is a link
            another user owns.
    """
    refuse_foreign_link(path)
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data.encode("utf-8", "replace") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise MemdocError(f"cannot write {path}: {exc.strerror or exc}") from None


def output_folder(path: Path) -> Path:
    """A folder to write outputs in: created (with its parents) when missing, never one
    reached through a link that another user planted, and one this user can write to.

    Raises:
        MemdocError: the path is another user's link, is not a folder, or cannot be
            created or written.
    """
    refuse_foreign_link(path)
    try:
        path.mkdir(parents=True, exist_ok=True)  # several nodes of a job may create it at once
    except FileExistsError:
        raise MemdocError(f"cannot write in {path}: it is a file, not a folder") from None
    except OSError as exc:
        raise MemdocError(f"cannot create folder {path} ({exc.strerror or exc})") from None
    if not path.is_dir():
        raise MemdocError(f"cannot write in {path}: it is a file, not a folder")
    if not os.access(path, os.W_OK | os.X_OK):
        raise MemdocError(f"cannot write in {path}: the folder is not writable")
    return path


def require_regular_file(path: Path) -> None:
    """Refuse to read a pipe, a socket or a device: opening a FIFO blocks until someone
    writes to it, and a device may never end. A missing file is left to opening to report.

    Raises:
        InputError: `path` exists and is not a regular file or a folder.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InputError(f"{path}: not a regular file (a pipe or a device); not reading it")
