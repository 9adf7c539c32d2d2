"""The job was killed: by the kernel's OOM killer, a platform or scheduler, or a bare SIGKILL."""

from __future__ import annotations

from memdoc.oom.hostcues import HostCues, Killer, WorkerEnd
from memdoc.rules.causes.host.pressure import Pressure
from memdoc.rules.causes.host.verdict import Verdict
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.trace.model import EventKind
from memdoc.units import format_bytes

SIGKILL = 9
KILL_HINT = 'run `dmesg | grep -i "killed process"` to see the kill'


def killed_by_signal(facts: Facts) -> bool:
    """The job, or one of its processes, ended by SIGKILL."""
    if facts.trace.exit is not None and facts.trace.exit.signal == SIGKILL:
        return True
    return any(e.data.get("signal") == SIGKILL for e in facts.trace.events(EventKind.PROCESS_EXIT))


def text_kill(cues: HostCues) -> Verdict:
    """A kill the error text reports: surest where the killer says it was for memory."""
    if cues.killed_by == Killer.KERNEL:
        return Verdict(Signals(STRONG), "The kernel's OOM killer killed the process.")
    if cues.killed_by == Killer.PLATFORM:
        summary = "The scheduler or platform says the job ran out of memory and stopped it."
        return Verdict(Signals(STRONG), summary)
    summary = "The process was killed without a Python error, the mark of the OOM killer."
    return Verdict(Signals(LIKELY), summary)


def worker_death(cues: HostCues) -> Verdict:
    """How a DataLoader worker died: SIGKILL points at the OOM killer, SIGTERM does not."""
    if cues.worker_end == WorkerEnd.KILLED:
        summary = "A DataLoader worker was killed by SIGKILL, usually the OOM killer."
        return Verdict(Signals(STRONG), summary)
    if cues.worker_end == WorkerEnd.TERMINATED:
        summary = "A DataLoader worker was terminated (SIGTERM): rarely a memory problem."
        return Verdict(Signals(WEAK), summary)
    summary = "A DataLoader worker exited unexpectedly; running out of host RAM is one cause."
    return Verdict(Signals(POSSIBLE), summary)


# A job that came close to its limit and was not stopped did not run out: it was close.
NEAR_LIMIT_TITLE = "The host's memory came close to its limit"


def recorded_kill(facts: Facts, fail: Failure | None, pressure: Pressure) -> Verdict | None:
    """No host error text: the OOM-kill counter, a SIGKILL and the memory curve tell."""
    killed = killed_by_signal(facts)
    if pressure.oom_kills > 0:
        summary = f"The kernel's OOM killer killed {pressure.oom_kills:g} process(es) of this job."
        return Verdict(Signals.of(STRONG, near_limit=pressure.near_limit), summary)
    if killed and pressure.near_limit:
        summary = (
            f"The job was killed (SIGKILL) with {pressure.reached_words}, near the "
            f"{format_bytes(pressure.limit_bytes)} {pressure.limit_label}."
        )
        return Verdict(Signals(STRONG), summary)
    if killed and pressure.kill_not_for_memory:
        return None
    if killed:
        summary = "The job was killed by SIGKILL; the kernel's OOM killer is the usual sender."
        return Verdict(Signals(POSSIBLE), summary, KILL_HINT)
    if pressure.near_limit and fail is None:
        summary = (
            f"The job reached {pressure.reached_words}, close to the "
            f"{format_bytes(pressure.limit_bytes)} {pressure.limit_label}."
        )
        return Verdict(Signals(POSSIBLE), summary, title=NEAR_LIMIT_TITLE)
    return None
