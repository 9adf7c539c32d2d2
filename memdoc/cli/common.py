"""What every command shares: the `Command` protocol and output helpers."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from memdoc.errors import MemdocError, OutputExistsError

if TYPE_CHECKING:
    from rich.console import Console


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


def print_unpadded(render: Callable[[Console], None]) -> None:
    """Render rich output to stdout; piped, without the spaces rich pads each line with to
    fill its width (80 columns when stdout is not a terminal)."""
    from rich.console import Console

    console = Console(highlight=False)
    if console.is_terminal:
        render(console)
        return
    with console.capture() as captured:
        render(console)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


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
