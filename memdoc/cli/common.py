"""What every command shares: the `Command` protocol and output helpers."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Protocol

from memdoc.errors import MemdocError, OutputExistsError

# The exit status of `explain` and `diagnose`, for CI scripts: a memory problem is an
# answer, not an error. 1 is memdoc failing; 2 a usage error or an input it cannot use.
NO_MEMORY_PROBLEM = 0
MEMORY_PROBLEM_FOUND = 3
INTERNAL_ERROR = 1
FINDINGS_EXIT_HELP = (
    "exit status: 0 no memory problem found, 3 memory problem found (a memory error or a "
    "finding), 1 memdoc itself failed, 2 usage error or an input it cannot use"
)


def findings_exit_code(found: bool) -> int:
    """3 when a memory problem was found, else 0."""
    return MEMORY_PROBLEM_FOUND if found else NO_MEMORY_PROBLEM


def internal_error(exc: Exception) -> MemdocError:
    """An unexpected failure of memdoc itself, as one line with exit status 1."""
    return MemdocError(
        f"memdoc failed ({type(exc).__name__}: {exc})",
        exit_code=INTERNAL_ERROR,
        hint="this is a bug in memdoc; please report it with the input",
    )


class Command(Protocol):
    """A subcommand module: `NAME`, `HELP`, `add_arguments(parser)`, `run(args) -> int`."""

    NAME: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def check_output_path(path: str | os.PathLike[str], *, force: bool) -> Path:
    """Refuse to overwrite without --force, and fail early on an unwritable folder."""
    out = Path(path)
    if out.exists() and not force:
        raise OutputExistsError(str(out))
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise MemdocError(f"cannot write {out}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise MemdocError(f"cannot write {out}: folder {parent} is not writable")
    return out


def warn(message: str) -> None:
    print(f"memdoc: warning: {message}", file=sys.stderr)


def read_text_input(source: str | None) -> str:
    """Read a file, or stdin for '-' or None. Undecodable bytes are replaced, not fatal."""
    try:
        data = sys.stdin.buffer.read() if source in (None, "-") else Path(source).read_bytes()
    except FileNotFoundError:
        raise MemdocError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise MemdocError(f"{source}: is a folder") from None
    except OSError as exc:
        raise MemdocError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    return data.decode("utf-8", errors="replace")
