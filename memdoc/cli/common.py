"""What every command shares: the `Command` protocol and output helpers."""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from memdoc.errors import MemdocError, OutputExistsError
from memdoc.files import refuse_foreign_link
from memdoc.printable import printable

# The exit status of `explain` and `diagnose`, for CI scripts: a memory problem is an
# answer, not an error. 1 is memdoc failing; 2 a usage error or an input it cannot use.
NO_MEMORY_PROBLEM = 0
MEMORY_PROBLEM_FOUND = 3
INTERNAL_ERROR = 1
FINDINGS_EXIT_HELP = (
    "exit status: 0 no memory problem found, 3 memory problem found (a memory error or a "
    "finding), 1 memdoc itself failed, 2 usage error or an input it cannot use"
)


class ExitStatus(int):
    """An exit status (128+N for a program killed by signal N, as a shell sees it) that
    remembers the signal. The console entry then dies of the same signal, as the program
    did, so that a shell or a parent sees what it would without memdoc (a shell's loop stops
    on Ctrl-C; `subprocess` reports -N)."""

    signal: int | None

    def __new__(cls, status: int, signal: int | None = None) -> ExitStatus:
        value = super().__new__(cls, status)
        value.signal = signal
        return value


def seconds(text: str) -> float:
    """An argparse type for an interval: a finite, positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def seconds_or_zero(text: str) -> float:
    """An argparse type for a wait: a finite number of seconds, zero or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be zero or more seconds: {text!r}")
    return value


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


def failing_in_one_line(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """`command`, with any failure of memdoc's own turned into one line and status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (MemdocError, BrokenPipeError):
            raise
        except Exception as exc:  # one line and status 1, never a traceback
            raise internal_error(exc) from exc

    return run


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
    refuse_foreign_link(out)
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
    from memdoc.report.console import SafeConsole

    console = SafeConsole()
    if console.is_terminal:
        render(console)
        return
    with console.capture() as captured:
        render(console)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


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
    print(f"memdoc: warning: {printable(message)}", file=sys.stderr)


# An error is at the end of its log: the last MiB holds it, and bounds time and memory.
TEXT_TAIL_BYTES = 1024 * 1024
_CHUNK_BYTES = 64 * 1024


# Lines before the tail are counted in at most this much of a file, so that a line number
# stays cheap; past it the error's line is left unknown rather than given wrong.
COUNTED_PREFIX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class TextTail:
    """The end of a text, and how many whole lines came before it (None: not counted)."""

    text: str
    lines_before: int | None = 0

    def line_number(self, line_in_tail: int | None) -> int | None:
        """The line of the whole text that is line `line_in_tail` (1-based) of the tail."""
        if line_in_tail is None or self.lines_before is None:
            return None
        return self.lines_before + line_in_tail


def read_text_input(source: str | None, *, tail_bytes: int = TEXT_TAIL_BYTES) -> TextTail:
    """The last `tail_bytes` of a file, or of stdin for '-' or None. Undecodable bytes are
    replaced, not fatal.

    Raises:
        MemdocError: no such file, a folder, or a pipe or device given by name (which could
            block or never end: pipe it to stdin instead).
    """
    before: int | None
    try:
        if source in (None, "-"):
            data, before = _tail_of_stream(sys.stdin.buffer, tail_bytes)
        else:
            data, before = _tail_of_file(Path(source), tail_bytes)
    except FileNotFoundError:
        raise MemdocError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise MemdocError(f"{source}: is a folder") from None
    except OSError as exc:
        raise MemdocError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    return TextTail(data.decode("utf-8", errors="replace"), before)


def _tail_of_file(path: Path, tail_bytes: int) -> tuple[bytes, int | None]:
    if not stat.S_ISREG(path.stat().st_mode):
        if path.is_dir():
            raise IsADirectoryError(path)
        raise MemdocError(
            f"{path}: not a regular file (a pipe or a device)",
            hint=f"pipe it in instead: tail -c 1M {path} | memdoc explain",
        )
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        start = max(0, size - tail_bytes)
        before = _newlines(stream, start) if start <= COUNTED_PREFIX_BYTES else None
        stream.seek(start)
        return stream.read(tail_bytes), before


def _newlines(stream: BinaryIO, end: int) -> int:
    """Line breaks in the first `end` bytes of a file."""
    count, read = 0, 0
    while read < end and (chunk := stream.read(min(16 * _CHUNK_BYTES, end - read))):
        count += chunk.count(b"\n")
        read += len(chunk)
    return count


def _tail_of_stream(stream: BinaryIO, tail_bytes: int) -> tuple[bytes, int]:
    """Read to the end, keeping only the last `tail_bytes` and counting the lines dropped."""
    kept = bytearray()
    dropped_lines = 0
    while chunk := stream.read(_CHUNK_BYTES):
        kept += chunk
        if len(kept) > 2 * tail_bytes:
            dropped_lines += kept.count(b"\n", 0, len(kept) - tail_bytes)
            del kept[:-tail_bytes]
    if len(kept) > tail_bytes:
        dropped_lines += kept.count(b"\n", 0, len(kept) - tail_bytes)
    return bytes(kept[-tail_bytes:]), dropped_lines
