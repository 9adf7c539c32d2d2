"""What every command shares: the `Command` protocol and output helpers."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from memdoc.errors import MemdocError, OutputExistsError


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


# What a folder of traces holds: `memdoc run -o DIR/` writes these names.
TRACE_SUFFIXES = (".memdoc", ".memdoc.gz")


def expand_folders(paths: Sequence[str]) -> list[str]:
    """Every trace in each folder given (in name order), files as they are.

    Raises:
        MemdocError: a folder holds no memdoc trace.
    """
    out: list[str] = []
    for given in paths:
        folder = Path(given)
        if not folder.is_dir():
            out.append(given)
            continue
        found = sorted(
            str(p) for p in folder.iterdir() if p.name.endswith(TRACE_SUFFIXES) and p.is_file()
        )
        if not found:
            raise MemdocError(
                f"{given}: a folder with no memdoc trace in it",
                hint="memdoc run -o DIR/ writes one trace per node there",
            )
        out.extend(found)
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
