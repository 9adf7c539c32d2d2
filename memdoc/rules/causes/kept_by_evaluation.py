"""What evaluation kept: memory an evaluation or prediction pass added and did not give back,
read from the loop's own phase marks (which carry the process's resident memory, and the
live tensors on its CUDA device, exactly at each phase change, however short the phase).
Part of `leak-across-steps`: the steps that leak are evaluation batches, and what they keep
are outputs, not graphs, where the loop had gradients off."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.trace.phases import Phase
from memdoc.units import MiB

# A pass counts as keeping memory above this much (resident memory moves by a page or two
# for nothing).
KEPT_NOISE_BYTES = 1 * MiB
# Most passes keep memory, not one: the first pass may warm a cache once.
MIN_KEEPING_SHARE = 0.7
MIN_TOTAL_BYTES = 4 * MiB
# Evaluation keeps clearly more per pass than a training phase does.
ABOVE_TRAINING = 2.0


@dataclass(frozen=True)
class EvaluationKept:
    passes: int  # evaluation passes measured end to end
    keeping: int  # of which kept memory
    per_pass_bytes: float  # median kept by a pass
    total_bytes: float  # kept by all passes together
    training_per_phase_bytes: float  # median kept by a training phase
    failed_in_evaluation: bool
    gradients_off: bool  # the loop ran evaluation with gradients off
    source: str  # the loop ("lightning", "transformers", "keras", "jax")


def kept_by_evaluation(facts: Facts, fail: Failure | None) -> EvaluationKept | None:
    """Evaluation passes that each kept memory, far more than training phases did: on the
    CUDA device the failure was on, where the phase marks read it, else in host memory."""
    pid = fail.pid if fail is not None else None
    mine = [p for p in facts.phases if pid is None or p.pid == pid]
    kept_by = _measure(mine, fail)
    netted = _net_of_given_back(mine, kept_by)
    evals = list(netted)
    if len(evals) < 2:
        return None
    kept = list(netted.values())
    keeping = sum(1 for k in kept if k > KEPT_NOISE_BYTES)
    total = sum(k for k in kept if k > 0)
    training = _median([kept_by(p) for p in mine if p.name == "train"])
    per_pass = statistics.median(kept)
    if keeping < MIN_KEEPING_SHARE * len(kept) or total < MIN_TOTAL_BYTES:
        return None
    if per_pass < ABOVE_TRAINING * max(training, 0.0):
        return None
    failing = _failing_phase(mine, fail)
    return EvaluationKept(
        passes=len(evals),
        keeping=keeping,
        per_pass_bytes=per_pass,
        total_bytes=total,
        training_per_phase_bytes=training,
        failed_in_evaluation=failing is not None and failing.evaluating,
        gradients_off=all(p.grad_enabled is False for p in evals),
        source=evals[-1].source,
    )


def _measure(mine: Sequence[Phase], fail: Failure | None) -> Callable[[Phase], int | None]:
    """What a phase kept, as the memory that ran out counts it: the live tensors on the
    failing CUDA device where the marks read that device, else the resident memory."""
    device = fail.oom.device if fail is not None else None
    if device is not None and device >= 0:
        on_device = [p.kept_on_device for p in mine]
        if any(k is not None and k[0] == device for k in on_device):

            def kept_there(phase: Phase) -> int | None:
                kept = phase.kept_on_device
                return kept[1] if kept is not None and kept[0] == device else None

            return kept_there
    return lambda phase: phase.kept_bytes


def _net_of_given_back(
    mine: Sequence[Phase], kept_by: Callable[[Phase], int | None]
) -> dict[Phase, float]:
    """What each evaluation pass kept, less what the training phase right after it gave
    back: memory an evaluation held at its end (its temporaries, which the allocator keeps
    until training reuses or returns them) is not kept when training hands it back."""
    netted: dict[Phase, float] = {}
    for i, phase in enumerate(mine):
        kept = kept_by(phase) if phase.evaluating else None
        if kept is None:
            continue
        after = next((p for p in mine[i + 1 :] if p.evaluating or p.name == "train"), None)
        given_back = kept_by(after) if after is not None and after.name == "train" else None
        netted[phase] = float(kept) + min(float(given_back or 0), 0.0)
    return netted


def _median(values: Sequence[int | None]) -> float:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else 0.0


def _failing_phase(mine: Sequence[Phase], fail: Failure | None) -> Phase | None:
    if fail is None:
        return None
    before = [p for p in mine if p.t0 <= fail.t]
    return before[-1] if before else None
