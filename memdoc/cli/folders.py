"""A folder of traces given to `diagnose` or `report` (`memdoc run -o DIR/`), read as one
run: traces that cannot be read, and traces of another run, are left out, each named in one
line on stderr, and the rest is read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from memdoc.cli.common import expand_folders, warn
from memdoc.errors import MemdocError
from memdoc.trace.reader import read_header
from memdoc.trace.runs import Member, newest, other_run


def traces_of_one_run(given: Sequence[str]) -> list[str]:
    """The files given, and for each folder given the traces in it of its newest run.

    Raises:
        MemdocError: a folder holds no memdoc trace, or none that can be read.
    """
    out: list[str] = []
    for path in given:
        out.extend(_run_in_folder(path) if Path(path).is_dir() else [path])
    return out


def _run_in_folder(folder: str) -> list[str]:
    members = _readable(expand_folders([folder]))
    if not members:
        raise MemdocError(
            f"{folder}: no trace in this folder can be read",
            hint="each one was named above with what is wrong with it",
        )
    run = newest(members).header
    kept: list[str] = []
    for member in members:
        why = other_run(run, member.header)
        if why is None:
            kept.append(member.name)
        else:
            warn(f"{member.name}: left out, a trace of another run ({why})")
    return kept


def _readable(paths: Sequence[str]) -> list[Member]:
    members: list[Member] = []
    for path in paths:
        try:
            members.append(Member(path, read_header(path)))
        except MemdocError as exc:
            warn(f"{exc.message}; left out, the other traces are read")
    return members
