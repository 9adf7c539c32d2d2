"""MD011 activations-too-large: the per-step working set does not fit."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from memdoc.kinds import OomKind
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Curve,
    Failure,
    baselines,
    innermost_frames,
    specific_library,
    tiny_request,
)
from memdoc.rules.host import (
    Limit,
)
from memdoc.rules.ledger import cached_unused_bytes, held_bytes, room_was_left, sizeable_cache
from memdoc.rules.serving import (
    kv_cache_empty,
    kv_cache_finding,
    kv_cache_short,
    shorter_context_fix,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    ratio_evidence,
    share_evidence,
    snippet,
)
from memdoc.rules.trend import fit_trend
from memdoc.thresholds import MODEL_FILLS_SHARE, nearly_full
from memdoc.trace.model import OomInfo
from memdoc.trace.phases import BatchSearch
from memdoc.units import format_bytes

GPU_KINDS = (OomKind.ALLOCATOR, OomKind.COMPILE)
# One activation that is this share of the process's memory is a large one: it scales with
# the batch, not with the weights.
SIZEABLE_REQUEST = 0.05
# The in-step rise must be a real share of what stays between steps.
LARGE_RISE = 0.5
# A process that held less than this share of its GPU when it failed was not alone there.
SHARED_BELOW = 0.5
TO_CONFIRM = (
    "run a few steps under `memdoc run`: it records the peak inside each step against the "
    "memory that stays between steps"
)


class ActivationsTooLarge(RuleSpec):
    slug = "activations-too-large"
    code = "MD011"
    title = "The per-step working set is too large"
    what = """
The memory needed inside one step (activations saved for backward, temporaries, gradients)
does not fit next to the weights and optimizer state. It scales with batch size, sequence
length and image resolution, and is the most common reason for an out-of-memory error.
"""
    why = """
Between steps only the weights, gradients and optimizer state stay in memory. During the
forward pass every layer saves its inputs for the backward pass, so the peak is reached at
the start of backward; attention over long sequences adds tensors quadratic in length. The
job fails in the first steps, or on the first unusually long or large input.
"""
    confirm = """
- The peak inside a step is far above the memory that stays between steps (`memdoc run`).
- The failing request shrinks when the batch or the sequence shrinks.
- The job fails early, in the forward or backward pass, with most of the device allocated;
  often in the very first step, before any step could be measured.
"""
    fixes = (
        Fix(
            "pytorch",
            "Smaller batches, same effective batch, with gradient accumulation",
            snippet(
                """
            accum = 4  # micro-batch = batch_size / accum
            for i, batch in enumerate(loader):
                loss = model(batch).loss / accum
                loss.backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Recompute activations in backward instead of storing them",
            snippet(
                """
            from torch.utils.checkpoint import checkpoint

            x = checkpoint(block, x, use_reentrant=False)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Run the forward pass in bf16",
            snippet(
                """
            import torch

            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = model(batch).loss
            """
            ),
        ),
        Fix(
            "tensorflow",
            "Smaller batches, and mixed precision",
            snippet(
                """
            import tensorflow as tf

            tf.keras.mixed_precision.set_global_policy("mixed_float16")
            model.fit(dataset.batch(16))
            """
            ),
        ),
        Fix(
            "jax",
            "Rematerialize blocks and shrink the batch",
            snippet(
                """
            import jax

            block = jax.checkpoint(block)  # recompute in backward
            """
            ),
        ),
    )
    references = (
        ("PyTorch: torch.utils.checkpoint", "https://pytorch.org/docs/stable/checkpoint.html"),
        ("PyTorch: automatic mixed precision", "https://pytorch.org/docs/stable/amp.html"),
        ("TensorFlow: mixed precision", "https://www.tensorflow.org/guide/mixed_precision"),
        (
            "JAX: jax.checkpoint",
            "https://jax.readthedocs.io/en/latest/_autosummary/jax.checkpoint.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        search = facts.batch_search
        if search is not None and search.ran_out and search.trained is not None:
            return self._searched(facts, fail, search)
        if not facts.is_text_only:
            device = facts.failed_device(fail.oom if fail else None)
            curve = facts.step_curve(device if device is not None and device >= 0 else None)
            if curve is not None and len(curve.steps) >= 2:
                return self._recorded(facts, fail, curve)
        if fail is None:
            return None
        if not facts.is_text_only and facts.on_host(fail.oom):
            found = self._inside_a_step(facts, fail)
            if found is not None:
                return found
        if kv_cache_short(fail):
            return self._kv_cache(facts, fail)
        return self._from_text(facts, fail)

    def _searched(self, facts: Facts, fail: Failure | None, search: BatchSearch) -> Finding:
        """A batch-size finder ran out at the larger sizes and trained at a smaller one: the
        step's working set, which grows with the batch, is what did not fit."""
        failed = sorted(set(search.ran_out))
        smallest_failed = failed[0]
        summary = (
            f"The batch-size search ({search.finder}) ran out of memory at "
            f"{_sizes(failed)} and trained at {search.trained}: a step's working set grows "
            f"with the batch, and at {smallest_failed} it did not fit."
        )
        evidence = [
            count_evidence("sizes tried", len(search.tried)),
            count_evidence("sizes that ran out", len(failed)),
            count_evidence("smallest size that ran out", smallest_failed),
            count_evidence("size that trained", search.trained or 0),
        ]
        room = search_room(facts, fail, search) if fail is not None else None
        if room is not None:
            summary += " " + room.words()
            evidence += room.evidence()
        return self.finding(
            facts,
            Signals.of(LIKELY, several_sizes_ran_out=len(failed) >= 2),
            summary,
            evidence,
            to_confirm=(
                f"`memdoc headroom` between {search.trained} and {smallest_failed} finds the "
                "largest size that fits with a margin"
            ),
            frameworks=facts.frameworks(fail.oom if fail else None),
        )

    def _kv_cache(self, facts: Facts, fail: Failure) -> Finding:
        """vLLM's cache for the context asked for is the serving engine's working set."""
        summary = (
            "vLLM could not fit the KV cache for the context length asked for in the memory "
            "left after the weights: a shorter max_model_len (or fewer sequences at once) "
            "needs less."
        )
        return kv_cache_finding(
            self,
            facts,
            fail,
            Signals(WEAK if kv_cache_empty(fail) else POSSIBLE),
            summary,
            to_confirm="vLLM logs the KV cache it could allocate at start ('GPU KV cache size: "
            "N tokens'): the context asked for must fit in it",
            fix=shorter_context_fix(fail),
        )

    def _inside_a_step(self, facts: Facts, fail: Failure) -> Finding | None:
        """Failed in a forward or backward pass before steps could be compared: the step's
        working set is the first suspect, the more so in the very first step."""
        phase = fail.stack_cues.phase
        requested = fail.oom.requested_bytes
        resident = facts.resident_at_failure(fail)
        sizeable = bool(requested and resident and requested >= SIZEABLE_REQUEST * resident)
        # A loss function the step calls ends its forward pass; one large request there is a
        # single allocation's question, not the step's working set.
        in_loss = fail.stack_cues.computing_loss and bool(resident) and not sizeable
        if phase is None and not in_loss:
            return None
        where = f"in the {phase} pass" if phase else "computing the loss"
        first = not facts.stepped_before(fail.t)
        limits = facts.host_limits(fail.pid, fail.host)
        evidence: list[Evidence] = [Evidence(f"failed {where}: {innermost_frames(fail)}")]
        if requested:
            evidence.append(bytes_evidence("requested", requested))
        if resident:
            evidence.append(bytes_evidence("resident memory of the process", resident))
        if limits:
            evidence.append(bytes_evidence(limits[0].label, limits[0].limit_bytes))
        when = "the first step" if first else "a step"
        summary = f"The job failed {where} of {when}"
        if requested:
            summary += f", asking for {format_bytes(requested)} more"
        if limits:
            summary += f" under the {format_bytes(limits[0].limit_bytes)} {limits[0].label}"
        if fail.module.get("recording_graph") is False:
            # Nothing was kept for a backward pass: what one layer makes at this batch.
            summary += ": with autograd off, what one layer makes at this batch does not fit."
        else:
            summary += ": what the step keeps for backward does not fit."
        signals = Signals.of(LIKELY, first_step=first, sizeable_request=sizeable)
        weights = facts.model_weights(fail)
        if weights is not None and weights.share >= MODEL_FILLS_SHARE:
            # The model and its gradients were most of it: a smaller batch saves little.
            summary += (
                f" But {weights.name}'s weights and gradients came to "
                f"{format_bytes(weights.with_gradients)}, {weights.share:.0%} of what the "
                "program held."
            )
            signals = signals.at_most(POSSIBLE)
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm="halve the batch: the failing request (and the peak) should halve too",
            frameworks=facts.frameworks(fail.oom),
        )

    def _recorded(self, facts: Facts, fail: Failure | None, curve: Curve) -> Finding | None:
        pairs = [
            (prev.baseline, s.peak)
            for prev, s in zip(curve.steps, curve.steps[1:], strict=False)
            if prev.baseline is not None and s.peak is not None
        ]
        if not pairs:
            return None
        baseline = statistics.median(b for b, _ in pairs)
        peak = max(p for _, p in pairs)
        if fail is not None:
            # The step that failed never ended: its peak is what was reached before the error.
            peak = max(peak, _peak_until(facts, curve, fail.t) or 0.0)
        rise = statistics.median(p - b for b, p in pairs)
        total = facts.curve_capacity(curve, fail.oom if fail else None)
        near_full = bool(total) and nearly_full(peak, float(total or 0))
        large = baseline > 0 and rise >= LARGE_RISE * baseline
        trend = fit_trend(baselines(curve.steps))
        flat = trend is None or trend.relative_growth < 0.1
        if fail is None and not (near_full and large):
            return None
        if fail is not None and not (large or near_full):
            return None
        evidence: list[Evidence] = [
            bytes_evidence("memory between steps (median)", baseline),
            bytes_evidence("rise inside a step (median)", rise),
            bytes_evidence("highest in-step peak", peak),
        ]
        if baseline > 0:
            evidence.append(ratio_evidence("in-step rise / between steps", rise / baseline))
        if total:
            evidence.append(share_evidence("peak / capacity", peak / total))
        if fail is None:
            signals = Signals(POSSIBLE)
            summary = f"Each step peaks at {format_bytes(peak)}, close to the limit."
        else:
            signals = Signals.of(LIKELY, large_rise=large, near_full=near_full, flat_baseline=flat)
            if not flat:
                signals = signals.at_most(POSSIBLE)
            summary = (
                f"Inside a step the {curve.label} rose by {format_bytes(rise)} over the "
                f"{format_bytes(baseline)} that stays between steps, and the job failed in a step."
            )
            if total and not curve.on_host and peak < SHARED_BELOW * total:
                signals = signals.at_most(WEAK)
                summary += (
                    f" But it held only {format_bytes(peak)} of the {format_bytes(total)} device:"
                    " look at what else holds the memory first."
                )
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            frameworks=facts.frameworks(fail.oom if fail else None),
        )

    def _from_text(self, facts: Facts, fail: Failure) -> Finding | None:
        oom = fail.oom
        if oom.framework == "host" or specific_library(oom) is not None or oom.phase == "load":
            return None
        bare_disguised = oom.kind == OomKind.DISGUISED and oom.requested_bytes is None
        if oom.kind not in GPU_KINDS and not bare_disguised:
            return None
        total = oom.total_bytes
        requested = oom.requested_bytes
        if oom.requested_unknown_huge or (requested and total and requested > total):
            return None  # one impossible request: single-allocation-too-large
        if requested is None or not total:
            return self._without_sizes(facts, oom)
        held = held_bytes(oom)
        cached = cached_unused_bytes(oom)
        evidence = [
            bytes_evidence("requested", requested),
            share_evidence("request / device", requested / total),
        ]
        if held is not None:
            evidence.append(share_evidence("held by this process / device", held / total))
        if held is not None and held < 0.5 * total:
            summary = (
                f"The job itself held only {format_bytes(held)} of the {format_bytes(total)} "
                "device: look at what else holds the memory first."
            )
            signals = Signals(WEAK)
        elif room_was_left(oom):
            summary = (
                f"The device still had {format_bytes(oom.free_bytes or 0)} free, more than the "
                "step asked for: the device was not the limit, see the other findings."
            )
            signals = Signals(WEAK)
        elif cached is not None and cached >= requested and sizeable_cache(cached, total):
            summary = "The request would have fit in the pool's unused cache: see fragmentation."
            signals = Signals(WEAK)
        else:
            summary = (
                f"The job held most of the {format_bytes(total)} device and needed "
                f"{format_bytes(requested)} more inside a step."
            )
            signals = Signals.of(
                POSSIBLE,
                request_a_tenth=requested >= 0.1 * total,
                shape_known=oom.shape is not None,
            )
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm=TO_CONFIRM,
            frameworks=facts.frameworks(oom),
        )

    def _without_sizes(self, facts: Facts, oom: OomInfo) -> Finding:
        if oom.shape is not None and not oom.xla_buffers and tiny_request(oom):
            signals = Signals(WEAK)
            summary = (
                f"A tensor of shape {list(oom.shape)}, only "
                f"{format_bytes(oom.requested_bytes or 0)}, did not fit: the device was "
                "already full before it, with what the step had built, the model's weights, or "
                "another process."
            )
        elif oom.shape is not None and not oom.xla_buffers:
            signals = Signals(LIKELY)
            summary = (
                f"A tensor of shape {list(oom.shape)} did not fit: the per-step working set "
                "is too large."
            )
        else:
            signals = Signals(WEAK)
            summary = (
                "The job ran out of memory; the usual reason is a step that needs more than fits."
            )
        return self.finding(
            facts,
            signals,
            summary,
            _shape_evidence(oom),
            to_confirm=TO_CONFIRM,
            frameworks=facts.frameworks(oom),
        )


# Less than this share of the limit left at the chosen size is no margin at all.
THIN_MARGIN = 0.05


@dataclass(frozen=True)
class SearchRoom:
    """How close the size a finder chose came to the limit, and where a straight line puts
    the largest size that fits: from the memory before the search (the fixed part) through
    the peak at the chosen size (the fixed part and `trained` times the cost of one)."""

    trained: int
    peak_bytes: float
    before_bytes: float
    limit: Limit
    estimate: int | None  # the largest size the line fits under the limit, below the failures

    @property
    def spare_share(self) -> float:
        return max(self.limit.limit_bytes - self.peak_bytes, 0.0) / self.limit.limit_bytes

    def words(self) -> str:
        said = (
            f"At {self.trained} the steps peaked at {format_bytes(self.peak_bytes, 2)} of the "
            f"{format_bytes(self.limit.limit_bytes, 2)} {self.limit.name} "
            f"({self.spare_share:.1%} to spare)"
        )
        if self.estimate is not None:
            said += (
                f"; a line from the {format_bytes(self.before_bytes)} held before the "
                f"search through that peak puts the largest size that fits near {self.estimate}"
            )
        if self.spare_share < THIN_MARGIN:
            said += (
                ". So close to the limit, a longer input, an evaluation or a fuller pool can "
                "still run out later: leave a margin"
            )
        return said + "."

    def evidence(self) -> list[Evidence]:
        out = [
            bytes_evidence(f"peak while training at {self.trained}", self.peak_bytes),
            bytes_evidence(self.limit.label, self.limit.limit_bytes),
            share_evidence("left to spare at that size", self.spare_share),
        ]
        if self.estimate is not None:
            out.append(count_evidence("largest size that fits, on a line", self.estimate))
        return out


def search_room(facts: Facts, fail: Failure, search: BatchSearch) -> SearchRoom | None:
    """The chosen size's peak against the limit that stopped the larger sizes, measured as
    that limit counts (`counted_against_limit`); None where the trace cannot tell."""
    counted = facts.counted_against_limit(fail)
    tries = search.try_times
    if counted is None or search.trained is None or not tries:
        return None
    start = tries[0]
    trained_from = max((t for t, size in search.try_marks if size == search.trained), default=None)
    if trained_from is None:
        return None
    until = search.chosen_t if search.chosen_t is not None else facts.trace.duration_s
    peak = counted.series.max_between(trained_from, until)
    before = counted.series.at(start)
    if peak is None or before is None:
        return None
    limit = counted.limit
    estimate = None
    per_unit = (peak - before) / search.trained
    if per_unit > 0 and limit.limit_bytes > before:
        fits = int((limit.limit_bytes - before) / per_unit)
        estimate = min(fits, min(search.ran_out) - 1) if search.ran_out else fits
        estimate = max(estimate, search.trained)
    return SearchRoom(search.trained, peak, before, limit, estimate)


def _sizes(sizes: list[int]) -> str:
    """ "64", "32 and 64", "22, 25, … and 64" for a long list."""
    words = [str(n) for n in sizes]
    if len(words) > 4:
        words = [*words[:2], "…", words[-1]]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _peak_until(facts: Facts, curve: Curve, t: float) -> float | None:
    """Highest value of the curve (and its interval peaks) from the last step end to `t`."""
    start = curve.steps[-1].t_end if curve.steps else 0.0
    found = [
        top
        for metric in (curve.metric, curve.metric + "_peak")
        if (series := facts.trace.series(metric, curve.device, curve.pid)) is not None
        and (top := series.max_between(start, t)) is not None
    ]
    return max(found) if found else None


def _shape_evidence(oom: OomInfo) -> list[Evidence]:
    if oom.shape is None:
        return []
    elements = 1
    for dim in oom.shape:
        elements *= dim
    return [
        Evidence(
            f"failing tensor: shape {list(oom.shape)}, {elements:,} elements",
            float(elements),
            "count",
        )
    ]


RULE = ActivationsTooLarge()
