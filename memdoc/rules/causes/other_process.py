"""MD002 other-process: another process holds the GPU memory this job needed."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from memdoc.kinds import OomKind
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    library_name,
    message_said,
    starved_library,
    tiny_request,
)
from memdoc.rules.ledger import held_bytes, pool_bytes
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.ledger import oom_this_process_bytes
from memdoc.trace.model import Metric, OomInfo, ProcessUsage
from memdoc.units import GiB, format_bytes

# A CUDA context plus library workspaces: what a process holds beyond its allocator's pool.
CONTEXT_ALLOWANCE_BYTES = 2 * GiB
# Below this, memory no process claims is the driver's own and display use, not a culprit.
UNACCOUNTED_MIN_BYTES = 1 * GiB
UNACCOUNTED_MIN_SHARE = 0.15
NAMED_MIN_SHARE = 0.05


@dataclass(frozen=True)
class _Others:
    named_bytes: float  # held by processes that are not this one, by name or PID
    unaccounted_bytes: float  # used on the device but claimed by nobody we can see
    pids: tuple[int, ...]
    # False when one of the named processes may be this one, seen from a container.
    certain: bool = True
    # True when only the framework's pool is known: the unaccounted figure is then what is
    # left after a CUDA context and its libraries' workspaces, which the message leaves out.
    beyond_context: bool = False


# The share of the device this process must hold for other processes not to be the cause.
MOSTLY_OURS = 0.75


class OtherProcess(RuleSpec):
    slug = "other-process"
    code = "MD002"
    title = "Another process holds the GPU memory"
    what = """
Memory on the GPU is held by a process other than this job: another training run, a
notebook kernel, an inference server, or a zombie left by an earlier run that did not exit.
This job then fails although its own usage is modest.
"""
    why = """
A GPU's memory is shared by every process that opens it, and nothing reserves it per
process. The out-of-memory message counts only what is left, so a job that fits alone fails
when it starts next to another one. Killed runs sometimes leave worker processes alive that
keep their memory until they are stopped.
"""
    confirm = """
- `nvidia-smi` (or `memdoc top`) lists every process on the GPU with its memory.
- In PyTorch 2.1+ messages, a "Process N has X memory in use" line for a PID that is not
  this one. In a container, your own process also appears as "Process N" because of PID
  namespaces: compare X with what PyTorch reserved.
- Total minus free minus what this process holds is large.
"""
    fixes = (
        Fix(
            "any",
            "See who holds the GPU",
            "nvidia-smi --query-compute-apps=pid,used_memory,name --format=csv",
            "bash",
        ),
        Fix("any", "Stop leftovers of an earlier run (check the PID first)", "kill <PID>", "bash"),
        Fix(
            "any",
            "Run on a GPU nobody else uses",
            "CUDA_VISIBLE_DEVICES=1 python train.py",
            "bash",
            gpu_only=True,
        ),
        Fix(
            "tensorflow",
            "When two TensorFlow programs share a GPU, let each grow instead of grabbing it all",
            snippet(
                """
            import tensorflow as tf

            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
            """
            ),
        ),
    )
    references = (
        ("nvidia-smi documentation", "https://docs.nvidia.com/deploy/nvidia-smi/index.html"),
        (
            "CUDA: CUDA_VISIBLE_DEVICES",
            "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars",
        ),
        (
            "PyTorch: CUDA memory management",
            "https://pytorch.org/docs/stable/notes/cuda.html#memory-management",
        ),
    )

    def ruled_out_by(self, oom: OomInfo) -> bool:
        """Other processes cannot have filled a device this process held most of."""
        if not oom.total_bytes:
            return False
        ours = held_bytes(oom)
        return ours is not None and ours >= MOSTLY_OURS * oom.total_bytes

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return self._sharing_without_oom(facts)
        oom = fail.oom
        device = facts.failed_device(oom)
        total = facts.device_total(device, oom)
        siblings = facts.trace.our_pids() - {fail.pid}
        others = _others_recorded(facts, fail, device) or _others_in_text(oom, total, siblings)
        judged = self._judge(facts, fail, others, total) if others and total else None
        return (
            judged
            or self._before_start(facts, fail)
            or self._outside_the_allocator(facts, fail)
            or self._full_before_a_tiny_request(facts, fail, total)
            or self._starved(facts, fail, total)
        )

    def _full_before_a_tiny_request(
        self, facts: Facts, fail: Failure, total: float | None
    ) -> Finding | None:
        """From a text with no device figures: a request of a few bytes or KiB failed, so
        the device was full before it, and another process is one thing that fills it."""
        oom = fail.oom
        if not facts.is_text_only or total or not tiny_request(oom) or oom.device_type == "cpu":
            return None
        summary = (
            f"Only {format_bytes(oom.requested_bytes or 0)} could not be had: the device was "
            "already full, and another process holding it is one reason; the text gives no "
            "figures for the device to tell."
        )
        return self._full_before_start(facts, oom, Signals(WEAK), summary)

    def _before_start(self, facts: Facts, fail: Failure) -> Finding | None:
        """Creating the CUDA context failed for lack of memory: it was gone before we began."""
        if fail.oom.phase != "init":
            return None
        summary = (
            "The GPU had no memory left even for this program's CUDA context: it was full "
            "before the program started, held by another process or a leftover of an earlier run."
        )
        return self._full_before_start(facts, fail.oom, Signals(STRONG), summary)

    def _outside_the_allocator(self, facts: Facts, fail: Failure) -> Finding | None:
        """PyTorch's bare "CUDA error: out of memory": a CUDA call outside the caching
        allocator failed (its own OOM reads "CUDA out of memory. Tried to allocate ..."). With
        no traceback to show which call, the most common one is creating the CUDA context
        or a library handle on a GPU that was already full."""
        oom = fail.oom
        if not (
            facts.is_text_only
            and oom.kind == OomKind.DISGUISED
            and oom.library == "cuda"
            and oom.framework == "pytorch"
            and oom.phase is None
            and not fail.stack
            and message_said(fail).cuda_runtime_call
        ):
            return None
        summary = (
            "A CUDA call outside PyTorch's caching allocator ran out of memory, most often "
            "creating the CUDA context or a library handle on a GPU that other processes had "
            "already filled; without a traceback, the text alone cannot tell which call."
        )
        return self._full_before_start(facts, oom, Signals(WEAK), summary)

    def _full_before_start(
        self, facts: Facts, oom: OomInfo, signals: Signals, summary: str
    ) -> Finding:
        """A finding that the GPU was full before this program asked: see who held it."""
        return self.finding(
            facts,
            signals,
            summary,
            [],
            to_confirm="run `nvidia-smi` before the job starts and look for other processes",
            frameworks=facts.frameworks(oom),
        )

    def _judge(self, facts: Facts, fail: Failure, others: _Others, total: float) -> Finding | None:
        oom = fail.oom
        named = others.named_bytes >= max(NAMED_MIN_SHARE * total, 1)
        unaccounted = others.unaccounted_bytes >= max(
            UNACCOUNTED_MIN_BYTES, UNACCOUNTED_MIN_SHARE * total
        )
        if not named and not unaccounted:
            return None
        held = others.named_bytes if named else 0.0
        held += max(others.unaccounted_bytes, 0.0) if unaccounted else 0.0
        fits = (
            oom.requested_bytes is not None
            and not oom.requested_unknown_huge
            and (oom.free_bytes or 0) + held >= oom.requested_bytes
        )
        if named:
            signals = Signals.of(
                STRONG if fits else POSSIBLE, holds_a_quarter=others.named_bytes >= 0.25 * total
            )
            who = ", ".join(f"PID {pid}" for pid in others.pids) or "other processes"
            summary = f"{who} held {format_bytes(others.named_bytes)} of this GPU."
            if not others.certain:
                signals = signals.at_most(POSSIBLE)
                summary += " (Inside a container, that PID may be this process itself.)"
        else:
            signals = Signals(LIKELY if fits else POSSIBLE)
            beyond = (
                "this process's pool and what a CUDA context and its libraries take"
                if others.beyond_context
                else "this process's allocator"
            )
            summary = (
                f"{format_bytes(others.unaccounted_bytes)} of the GPU were used by something "
                f"other than {beyond}: another process, or another library here."
            )
        evidence: list[Evidence] = [
            bytes_evidence("held by other processes", held),
            share_evidence("share of the device", held / total),
        ]
        if oom.requested_bytes is not None and not oom.requested_unknown_huge:
            evidence.append(bytes_evidence("requested", oom.requested_bytes))
        if fits:
            summary += " Without it, the request would have fit."
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm=None
            if named and others.certain
            else "run `nvidia-smi` or `memdoc top` while the job runs",
            frameworks=facts.frameworks(oom),
            extra={"pids": list(others.pids)},
        )

    def _starved(self, facts: Facts, fail: Failure, total: float | None) -> Finding | None:
        """Almost nothing free while the error shows nothing held by this process."""
        oom = fail.oom
        own = (
            oom.allocated_bytes,
            oom.reserved_bytes,
            oom.this_process_bytes,
            oom.bfc_in_use_bytes,
        )
        nothing_own = all(v is None for v in own)
        if total and oom.free_bytes is not None and nothing_own and oom.free_bytes < 0.1 * total:
            evidence = [
                bytes_evidence("free on the device", oom.free_bytes),
                bytes_evidence("device total", total),
            ]
            summary = (
                f"Only {format_bytes(oom.free_bytes)} of {format_bytes(total)} were free, and "
                "the error shows nothing held by this process: something else holds the GPU."
            )
            return self.finding(
                facts,
                Signals(LIKELY),
                summary,
                evidence,
                to_confirm="run `nvidia-smi` to see which processes hold the GPU",
                frameworks=facts.frameworks(oom),
            )
        if oom.library in ("cudnn", "cublas") and starved_library(fail):
            summary = (
                f"A {library_name(oom)} handle could not be created: often the GPU is already "
                "full, sometimes because another process holds it."
            )
            return self._full_before_start(facts, oom, Signals(WEAK), summary)
        return None

    def _sharing_without_oom(self, facts: Facts) -> Finding | None:
        """A run that did not fail but shared a GPU with a big foreign process."""
        ours = facts.trace.our_pids()
        for device in facts.trace.devices():
            total = facts.trace.device_total_bytes(device.index)
            if not total:
                continue
            foreign = [
                s
                for s in facts.trace.series_for(Metric.GPU_PROC_USED, device=device.index)
                if s.key.pid not in ours and s.max() is not None
            ]
            ours_there = any(
                s.key.pid in ours
                for s in facts.trace.series_for(Metric.GPU_PROC_USED, device=device.index)
            )
            held = sum(top[1] for s in foreign if (top := s.max()) is not None)
            if ours_there and held >= 0.25 * total:
                evidence = [
                    bytes_evidence("held by other processes", held),
                    share_evidence("share of the device", held / total),
                ]
                summary = f"Other processes held {format_bytes(held)} of GPU {device.index}."
                return self.finding(facts, Signals(POSSIBLE), summary, evidence)
        return None


def _others_recorded(facts: Facts, fail: Failure, device: int | None) -> _Others | None:
    """Other processes as NVML saw them on the device, at the moment of the failure."""
    if facts.is_text_only or device is None:
        return None
    ours = facts.trace.our_pids()
    per_process = facts.trace.series_for(Metric.GPU_PROC_USED, device=device)
    if not per_process:
        return None
    named = 0.0
    mine = 0.0
    pids: list[int] = []
    for series in per_process:
        value = series.at(fail.t + 1e-9) or (series.max() or (0.0, 0.0))[1]
        if series.key.pid in ours:
            mine += value
        elif value > 0 and series.key.pid is not None:
            named += value
            pids.append(series.key.pid)
    used = facts.trace.series(Metric.GPU_USED, device=device)
    used_now = used.at(fail.t + 1e-9) if used is not None else None
    unaccounted = used_now - mine - named if used_now is not None else 0.0
    return _Others(named, unaccounted, tuple(pids))


def _others_in_text(oom: OomInfo, total: float | None, siblings: Set[int | None]) -> _Others | None:
    """Other processes from the message's process lines, or from its arithmetic.

    The job's other processes (`siblings`: ranks, workers) named in the message are not
    others: what they hold is the job's own.
    """
    own_pool = pool_bytes(oom)
    ours = [p for p in oom.processes if p.pid in siblings and not p.this_process]
    others = [p for p in oom.processes if not p.this_process and p.used_bytes and p not in ours]
    siblings_bytes = sum(p.used_bytes or 0 for p in ours)
    this = next((p for p in oom.processes if p.this_process), None)
    if this is None and own_pool is not None:
        this = _self_in_namespace(others, own_pool, total)
        others = [p for p in others if p is not this]
    # Without our own numbers, a lone "Process N" line cannot be told apart from this one.
    certain = this is not None or own_pool is not None or len(others) > 1
    named = float(sum(p.used_bytes or 0 for p in others))
    pids = tuple(p.pid for p in others if p.pid is not None)
    if total is None or oom.free_bytes is None:
        return _Others(named, 0.0, pids, certain) if others else None
    this_bytes = oom_this_process_bytes(oom) or (this.used_bytes if this is not None else None)
    if this_bytes is not None:
        unaccounted = total - oom.free_bytes - this_bytes - named - siblings_bytes
    elif own_pool is not None and not oom.processes:
        unaccounted = total - oom.free_bytes - own_pool - CONTEXT_ALLOWANCE_BYTES
        return _Others(named, unaccounted, pids, certain, beyond_context=True)
    else:
        unaccounted = 0.0
    return _Others(named, unaccounted, pids, certain)


def _self_in_namespace(
    others: list[ProcessUsage], own_pool: float, total: float | None
) -> ProcessUsage | None:
    """In a container NVML reports host PIDs, so this process shows up as "Process N".

    The entry whose usage is this process's pool plus a context is taken to be this one; so
    is a lone entry that could not fit on the device beside this process's pool.
    """
    matches = [
        p
        for p in others
        if p.used_bytes is not None and 0 <= p.used_bytes - own_pool <= CONTEXT_ALLOWANCE_BYTES
    ]
    if len(matches) == 1:
        return matches[0]
    lone = others[0] if len(others) == 1 else None
    if lone is not None and lone.used_bytes and total and lone.used_bytes + own_pool > total:
        return lone
    return None


RULE = OtherProcess()
