"""A host allocation failed: under a cap, in RAM, or in a DataLoader worker."""

from __future__ import annotations

from memdoc.oom.hostcues import HostCues
from memdoc.rules.causes.host.verdict import Verdict
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.units import format_bytes

_WATCH = "watch the process's memory as it fails (`memdoc run`)"


def failed_allocation(facts: Facts, fail: Failure, cues: HostCues, *, workers: bool) -> Verdict:
    """A host allocation failed: the limit itself only when nothing else can be blamed."""
    if workers:
        return Verdict(Signals(STRONG), "A DataLoader worker could not allocate host memory (RAM).")
    if facts.is_text_only:
        return _from_text(fail, cues)
    if facts.gpu_recorded:
        summary = "A host memory (RAM) allocation failed in a GPU job: RAM, not the GPU, ran out."
        return Verdict(Signals(LIKELY), summary)
    limits = facts.host_limits(fail.pid, fail.host)
    under = f" under the {format_bytes(limits[0].limit_bytes)} {limits[0].label}" if limits else ""
    summary = (
        f"An allocation in host memory failed{under}. The run used no GPU, so every memory "
        "problem ends this way here: the cause is what drove memory up."
    )
    to_confirm = "look at the other findings, and at `memdoc report` for what grew"
    return Verdict(Signals(WEAK), summary, to_confirm)


def _from_text(fail: Failure, cues: HostCues) -> Verdict:
    """An error text alone: as sure as its words make it that the memory was the host's."""
    if fail.oom.requested_bytes is None and cues.bad_alloc:
        summary = (
            "A C++ allocation failed (std::bad_alloc) without saying its size: host memory ran "
            "out, or a size read from a damaged file or bad input asked for more than any "
            "machine has."
        )
        return Verdict(Signals(WEAK), summary, _WATCH)
    if not cues.names_host:
        # A bare "out of memory" that names no device: the host's only as often as not.
        summary = "An allocation failed, and the text names no GPU: host memory (RAM) ran out."
        return Verdict(Signals(POSSIBLE), summary, _WATCH)
    return Verdict(Signals(STRONG), "An allocation in host memory (RAM) failed.")
