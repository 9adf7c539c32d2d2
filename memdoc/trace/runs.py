"""Which traces of a folder belong to one run: the nodes of one job share its id (when the
launcher names the job), its command (but for the node's rank) and its start."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.trace.model import Header
from memdoc.units import format_duration

# The nodes of one job start together: torchrun waits this long (its default rendezvous
# timeout) for the last node to join. Traces that started further apart are other runs.
SAME_START_S = 900.0
# The one word of a command that differs from node to node: torchrun's node rank.
_NODE_RANK = re.compile(r"^--node[-_]rank(=.*)?$")


@dataclass(frozen=True)
class Member:
    """A trace of a folder, known by its header."""

    name: str
    header: Header


def newest(members: Sequence[Member]) -> Member:
    """The trace that started last: the run it belongs to is the one a folder stands for."""
    return max(members, key=lambda m: m.header.created_unix)


def other_run(run: Header, trace: Header) -> str | None:
    """Why `trace` belongs to another run than `run`, in a few words; None when it is one of
    its traces."""
    if run.run_id is not None and trace.run_id is not None and run.run_id != trace.run_id:
        return f"job {trace.run_id}, not {run.run_id}"
    # Without a shared job id, the command says it (the node's rank apart).
    shared_job = run.run_id is not None and trace.run_id == run.run_id
    if not shared_job and _command(run.command) != _command(trace.command):
        shown = " ".join(trace.command)[:120] or "no command recorded"
        return f"another command: {shown}"
    gap = trace.created_unix - run.created_unix
    if abs(gap) > SAME_START_S:
        when = "before" if gap < 0 else "after"
        return f"started {format_duration(abs(gap))} {when} this run"
    return None


def _command(command: Sequence[str]) -> tuple[str, ...]:
    """The command without its node rank (`--node-rank 1`, `--node_rank=1`)."""
    out: list[str] = []
    skip = False
    for word in command:
        if skip:
            skip = False
            continue
        found = _NODE_RANK.match(word)
        if found is None:
            out.append(word)
        else:
            skip = found.group(1) is None
    return tuple(out)
