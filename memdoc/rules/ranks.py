"""Cross-rank rules: which rank failed first, and memory skew between ranks."""

from __future__ import annotations

import dataclasses

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import GPU_FRAMEWORKS, Failure, series_named
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    ratio_evidence,
    seconds_evidence,
    snippet,
)
from memdoc.trace.model import EventKind, Metric, framework_metric
from memdoc.trace.reader import Run, Trace
from memdoc.units import GiB, format_bytes, format_duration

SKEW_RATIO = 1.25
SKEW_MIN_BYTES = 1 * GiB
# ... or this share of what the failing rank could have had, where less: a capped rank on a
# host has hundreds of MiB, and one holding half as much again as the others is skewed.
SKEW_MIN_SHARE = 0.10


def rank_of(run: Run, trace: Trace) -> int:
    """The trace's rank; for a trace of a whole node (`memdoc run -- torchrun`), the rank of
    the process whose memory error ended it; else its position among the run's traces."""
    if trace.rank is not None:
        return trace.rank
    failing = _failing_process_rank(trace)
    return failing if failing is not None else run.traces.index(trace)


def _failing_pid(trace: Trace) -> int | None:
    """The process whose memory error ended the trace, else the first that exited failing."""
    event = trace.ending_oom_event()
    if event is not None and event.pid is not None:
        return event.pid
    for exit_event in trace.events(EventKind.PROCESS_EXIT):
        code, sig = exit_event.data.get("code"), exit_event.data.get("signal")
        if exit_event.pid is not None and (sig is not None or code not in (0, None)):
            return exit_event.pid
    return None


def _failing_process_rank(trace: Trace) -> int | None:
    pid = _failing_pid(trace)
    found = [p.rank for p in trace.processes() if p.pid == pid and p.rank is not None]
    return found[0] if found else None


def where_failed(trace: Trace) -> str:
    """Where in the job a trace failed, for people: node, host and process, as known."""
    parts = []
    if trace.header.node_rank is not None:
        parts.append(f"node {trace.header.node_rank}")
    if trace.header.host:
        parts.append(f"host {trace.header.host}")
    pid = _failing_pid(trace)
    if pid is not None:
        parts.append(f"pid {pid}")
    return ", ".join(parts)


class _CrossRankRule(RuleSpec):
    """A catalogue entry that compares ranks; a single trace never triggers it."""

    def check(self, facts: Facts) -> Finding | None:
        return None

    def check_run(self, run: Run) -> list[Finding]:
        raise NotImplementedError

    def ranked(self, finding: Finding, rank: int) -> Finding:
        return dataclasses.replace(finding, rank=rank)


class RankFailedFirst(_CrossRankRule):
    slug = "rank-failed-first"
    code = "MD101"
    title = "One rank failed first and took the others down"
    what = """
In a multi-process job, one rank ran out of memory (or died) first; the other ranks then
failed or timed out waiting for it in a collective. Their errors are consequences: the first
failure is the one to explain.
"""
    why = """
Data-parallel ranks wait for each other at every collective. When one dies, the rest hang
until the NCCL timeout or fail with a communication error, so the last lines of a combined
log rarely come from the rank that caused it.
"""
    confirm = """
- Compare the wall-clock times of each rank's first error (`memdoc diagnose` reads every
  rank's trace and does this).
- The first rank's error is a memory error; the others are timeouts or NCCL errors.
"""
    fixes = (
        Fix(
            "any",
            "Read every node's trace as one run, and watch the node that failed first",
            snippet(
                """
            memdoc run -o runs/exp42/ -- torchrun ...   # on each node: one trace per node
            memdoc diagnose runs/exp42/                 # which rank, on which node, first
            memdoc live runs/exp42/                     # replay the node that failed first
            """
            ),
            "bash",
        ),
        Fix(
            "pytorch",
            "Fail fast instead of hanging when a rank dies",
            snippet(
                """
            import datetime, torch.distributed as dist

            dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5))
            """
            ),
        ),
    )
    references = (
        (
            "PyTorch: distributed communication package",
            "https://pytorch.org/docs/stable/distributed.html",
        ),
        ("PyTorch: torchrun (elastic launch)", "https://pytorch.org/docs/stable/elastic/run.html"),
    )

    def check_run(self, run: Run) -> list[Finding]:
        if len(run.traces) < 2:
            return []
        first = run.failed_first()
        if first is None:
            return []
        times = {id(t): when for t in run.traces if (when := _failed_at(t)) is not None}
        others = [
            when for t in run.traces if t is not first and (when := times.get(id(t))) is not None
        ]
        ahead = min(others) - times[id(first)] if others else None
        rank = rank_of(run, first)
        evidence = [
            count_evidence("ranks that failed", len(times)),
            count_evidence("of ranks", len(run.traces)),
        ]
        if ahead is not None:
            evidence.append(seconds_evidence("ahead of the next failure", ahead))
        if first.header.node_rank is not None:
            evidence.append(
                count_evidence("node rank of the first failure", first.header.node_rank)
            )
        where = where_failed(first)
        summary = (
            f"Rank {rank}"
            + (f" ({where})" if where else "")
            + " failed first"
            + (
                f", {format_duration(ahead)} before any other rank."
                if ahead is not None
                else "; no other rank failed."
            )
        )
        signals = Signals.of(
            LIKELY, others_failed_later=bool(others), ended_in_oom=first.ending_oom() is not None
        )
        return [self.ranked(self.finding(Facts(first), signals, summary, evidence), rank)]


class RankMemorySkew(_CrossRankRule):
    slug = "rank-memory-skew"
    code = "MD102"
    title = "Ranks use very different amounts of memory"
    what = """
One rank's peak memory is well above the others'. With identical model copies, the extra
comes from uneven data (longer sequences or larger images on one rank), or from work done on
one rank only (logging, evaluation, gathering results on rank 0).
"""
    why = """
Data-parallel training assumes every rank does the same work. Uneven batches, `if rank ==
0:` blocks that keep tensors on the GPU, and gathers to a single rank break that, and the
heaviest rank sets the limit for the whole job.
"""
    confirm = """
- Peak memory per rank differs by more than a quarter (`memdoc diagnose` on all ranks'
  traces, or on one node's trace from `memdoc run -- torchrun ...`, which samples each rank
  on its own; or `nvidia-smi` while the job runs).
- The heaviest rank is rank 0, or the rank that got the longest inputs.
"""
    fixes = (
        Fix(
            "pytorch",
            "Balance sequence lengths across ranks",
            snippet(
                """
            from torch.utils.data.distributed import DistributedSampler

            # with batches bucketed by length, so every rank gets similar sizes
            sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Move rank-0-only results off the GPU",
            snippet(
                """
            if dist.get_rank() == 0:
                gathered = [t.cpu() for t in gathered]
            """
            ),
        ),
    )
    references = (
        (
            "PyTorch: DistributedSampler",
            "https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
        ),
        ("PyTorch: DDP notes", "https://pytorch.org/docs/stable/notes/ddp.html"),
    )

    def check(self, facts: Facts) -> Finding | None:
        """One trace of a whole node (`memdoc run -- torchrun`): its ranks' own processes."""
        peaks = facts.rank_peaks()
        fail = facts.failure
        failed = None
        if fail is not None:
            failed = next((p.rank for p in facts.trace.processes() if p.pid == fail.pid), None)
        return self._skewed(facts, peaks, failed)

    def check_run(self, run: Run) -> list[Finding]:
        peaks = {rank_of(run, t): p for t in run.traces if (p := _peak_memory(t)) is not None}
        failed = run.failed_first()
        failed_rank = rank_of(run, failed) if failed is not None else None
        if len(peaks) < 2:
            return []
        top = max(peaks, key=lambda r: peaks[r])
        trace = next(t for t in run.traces if rank_of(run, t) == top)  # whose limits apply
        found = self._skewed(Facts(trace), peaks, failed_rank)
        return [found] if found is not None else []

    def _skewed(self, facts: Facts, peaks: dict[int, float], failed: int | None) -> Finding | None:
        """The highest rank's peak against the lowest's, when far above it."""
        if len(peaks) < 2:
            return None
        top_rank = max(peaks, key=lambda r: peaks[r])
        low_rank = min(peaks, key=lambda r: peaks[r])
        high, low = peaks[top_rank], peaks[low_rank]
        if low <= 0 or high / low < SKEW_RATIO or high - low < _least_skew(facts):
            return None
        evidence = [
            bytes_evidence(f"peak on rank {top_rank}", high),
            bytes_evidence(f"peak on rank {low_rank}", low),
            ratio_evidence("highest / lowest", high / low),
        ]
        summary = (
            f"Rank {top_rank} peaked at {format_bytes(high)}, {high / low:.1f}x rank {low_rank} "
            f"({format_bytes(low)})"
            + (f", and rank {top_rank} ran out." if failed == top_rank else ".")
        )
        fail = facts.failure
        # Evened out, the rank that ran out would hold the ranks' mean: if that frees more
        # than it asked for, balancing the ranks changes the outcome.
        excess = high - sum(peaks.values()) / len(peaks)
        request = fail.oom.requested_bytes if fail is not None and failed == top_rank else None
        evened_fits = bool(request) and excess >= (request or 0)
        if evened_fits:
            summary += (
                f" Evened out, each rank would hold about {format_bytes(high - excess)}: "
                f"{format_bytes(excess)} less than rank {top_rank}, more than the "
                f"{format_bytes(request)} it asked for."
            )
            evidence.append(bytes_evidence(f"rank {top_rank} above the ranks' mean", excess))
        signals = Signals.of(
            LIKELY, top_rank_failed_first=failed == top_rank, evened_out_it_fits=evened_fits
        )
        if failed == top_rank and fail is not None and fail.stack_cues.loading_checkpoint:
            # What only that rank loaded is the difference: the load is the cause to look at.
            summary += " It ran out loading a checkpoint, which the other ranks did not hold."
            signals = signals.at_most(POSSIBLE)
        elif failed == top_rank and fail is not None and _evaluating(fail):
            # An evaluation on that rank alone (rank 0 scores the validation set) is the
            # difference: what the evaluation holds is the cause to look at.
            summary += " It ran out evaluating, as a rank that evaluates alone does."
            signals = signals.at_most(POSSIBLE)
        return self.ranked(self.finding(facts, signals, summary, evidence), top_rank)


def _evaluating(fail: Failure) -> bool:
    """The error came out of evaluation: a function named for it, or a model's forward in
    evaluation mode."""
    return fail.stack_cues.evaluation or fail.module.get("training") is False


def _least_skew(facts: Facts) -> float:
    """The least difference between ranks that counts: SKEW_MIN_BYTES, or SKEW_MIN_SHARE of
    the memory the failing rank could have had where that is less (a host's capped rank)."""
    fail = facts.failure
    capacity = facts.capacity_at_failure(fail) if fail is not None else None
    if capacity is None and (limit := facts.job_limit()) is not None:
        capacity = limit.limit_bytes
    return min(SKEW_MIN_BYTES, SKEW_MIN_SHARE * capacity) if capacity else SKEW_MIN_BYTES


def _failed_at(trace: Trace) -> float | None:
    ends = [e.t for e in trace.oom_events()]
    if trace.exit is not None and trace.exit.status not in (0, None):
        ends.append(trace.exit.t)
    return trace.header.created_unix + min(ends) if ends else None


def _peak_memory(trace: Trace) -> float | None:
    """The highest framework-allocated memory of the trace, else its host RSS."""
    best: float | None = None
    for framework in GPU_FRAMEWORKS:
        for quantity in (Metric.ALLOCATED, Metric.ALLOCATED_PEAK):
            for series in series_named(trace, framework_metric(framework, quantity)):
                top = series.max()
                if top is not None and (best is None or top[1] > best):
                    best = top[1]
    if best is None and (rss := trace.peak(Metric.HOST_RSS)) is not None:
        best = rss[1]
    return best


RANK_FAILED_FIRST = RankFailedFirst()
RANK_MEMORY_SKEW = RankMemorySkew()
