"""Shared memory (/dev/shm) ran out: a bus error, or a DataLoader worker's segment."""

from __future__ import annotations

from memdoc.oom.hostcues import HostCues
from memdoc.rules.causes.host.verdict import Verdict
from memdoc.rules.confidence import POSSIBLE, STRONG, Signals


def shared_memory_verdict(cues: HostCues, *, workers: bool) -> Verdict:
    """Sure where shared memory or the workers sharing it are named; a bare bus error has
    other causes."""
    if cues.shared_memory or cues.workers or workers:
        return Verdict(Signals(STRONG), "A DataLoader worker ran out of shared memory (/dev/shm).")
    summary = (
        "A bus error with nothing around it: shared memory (/dev/shm) running out is "
        "the usual cause in a training job, but a full disk, a damaged file or a "
        "mapping the hardware refused end the same way."
    )
    return Verdict(Signals(POSSIBLE), summary)
