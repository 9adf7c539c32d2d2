"""MD008 leak-across-steps: something keeps memory alive step after step."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from memdoc.kinds import OomKind
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.causes.kept_by_evaluation import EvaluationKept, kept_by_evaluation
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    HELD_SHARE,
    Curve,
    Failure,
    growth_words,
    innermost_frames,
    specific_library,
    trained_after,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    share_evidence,
    snippet,
)
from memdoc.rules.trend import Trend
from memdoc.trace.model import EventKind
from memdoc.units import MiB, format_bytes

TO_CONFIRM = (
    "run it under `memdoc run` for a few steps: a leak shows as allocated memory at step "
    "boundaries that rises steadily"
)
KEEP_LESS_FOR_METRICS_FIX = Fix(
    "pytorch",
    "Keep less of each evaluation batch, and move it off the GPU sooner (Trainer)",
    snippet(
        """
    from transformers import Trainer, TrainingArguments

    def keep_ids(logits, labels):
        return logits.argmax(dim=-1)  # what the metric needs, not the whole logits

    args = TrainingArguments(output_dir="out", eval_accumulation_steps=8)
    trainer = Trainer(model, args, preprocess_logits_for_metrics=keep_ids)
    """
    ),
)


RETRY_AFTER_THE_HANDLER_FIX = Fix(
    "pytorch",
    "Retry after the except block, not inside it",
    snippet(
        """
    import torch

    batch = 512
    while True:
        try:
            train(batch)
            break
        except torch.OutOfMemoryError:  # RuntimeError for the CPU's allocator
            pass  # leaving the block frees the failed try's traceback and its tensors
        batch //= 2
    """
    ),
)


KEEP_FOR_METRICS_FIX = Fix(
    "pytorch",
    "Keep what the metric needs, on the CPU, and clear it after each evaluation",
    snippet(
        """
    def validation_step(self, batch, batch_idx):
        logits = self(batch["x"])
        self.preds.append(logits.argmax(dim=-1).cpu())  # not: self.preds.append(logits)

    def on_validation_epoch_end(self):
        accuracy = compute_accuracy(torch.cat(self.preds))
        self.preds.clear()  # what is kept for one evaluation goes with it
    """
    ),
)
KERAS_EMA_FIX = Fix(
    "tensorflow",
    "Let the optimizer keep one moving average of the weights (Keras)",
    snippet(
        """
        optimizer = keras.optimizers.AdamW(use_ema=True, ema_momentum=0.999)
        model.compile(optimizer=optimizer, loss=loss)
        # not: a callback that appends model.get_weights() after each batch
        model.fit(x, y)  # at its end, fit gives the model the averaged weights
        """
    ),
)
# A copy of the model's weights kept every step: one running average instead.
WEIGHT_AVERAGE_FIXES = (
    Fix(
        "pytorch",
        "Keep one running average of the weights, updated in place, not a copy per step",
        snippet(
            """
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
        for batch in loader:
            ...
            optimizer.step()
            # not: snapshots.append(copy.deepcopy(model.state_dict()))
            ema.update_parameters(model)
        """
        ),
    ),
    *(
        dataclasses.replace(KERAS_EMA_FIX, framework=framework)
        for framework in ("tensorflow", "jax")
    ),
)
# Growth per step within this share of a whole number of weight copies is read as copies,
# for models of at least MIN_MODEL_BYTES (a tiny model's size matches anything).
WEIGHT_COPY_TOLERANCE = 0.1
MIN_MODEL_BYTES = 1 * MiB
MAX_WEIGHT_COPIES = 4

# The loops' names, as the finding says them.
FRAMEWORK_LOOPS = {
    "lightning": "Lightning loop",
    "transformers": "Trainer",
    "keras": "Keras loop",
    "jax": "program",
}


class LeakAcrossSteps(RuleSpec):
    slug = "leak-across-steps"
    code = "MD008"
    title = "Memory kept alive step after step"
    what = """
Memory at the end of each training step is higher than at the end of the step before, until
the job runs out. Something holds on to tensors, and often to the autograd graph behind
them, from every step.
"""
    why = """
The usual holders: a running total of the loss kept as a tensor (`total_loss += loss`, which
keeps every step's graph), outputs appended to a list for logging or metrics, hooks that
store activations, caches keyed by input, copies of the weights kept by a callback or a
hand-made average (memdoc names these when the growth per step is a whole number of
model copies), or metric objects that accumulate state on the
GPU. In Python the memory is freed only when the last reference goes. An exception being
handled is such a reference: a retry made inside the `except` block of an out-of-memory
error runs beside the failed try's frames and every tensor they hold (memdoc names this when
the last error was raised while earlier ones were still being handled).
"""
    confirm = """
- Allocated memory read at step boundaries rises steadily (`memdoc run` records it at every
  step and fits the slope).
- The job fails after many steps, not in the first one.
- An evaluation runs out while its loop adds the batch's outputs to all it has kept since
  the evaluation began (the Hugging Face Trainer's `nested_concat`, keeping logits for
  `compute_metrics`).
- `torch.cuda.memory._record_memory_history()` and a snapshot show the same source line
  growing.
"""
    fixes = (
        Fix(
            "pytorch",
            "Log numbers, not tensors that keep the graph",
            snippet(
                """
            running_loss += loss.item()          # not: running_loss += loss
            history.append(outputs.detach().cpu())  # not: history.append(outputs)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Release per-step state and hooks",
            snippet(
                """
            metrics.reset()
            for handle in hook_handles:
                handle.remove()
            hook_handles.clear()
            """
            ),
        ),
        Fix(
            "tensorflow",
            "Do not build new graph pieces or models inside the loop",
            snippet(
                """
            import tensorflow as tf

            tf.keras.backend.clear_session()  # when models are created in a loop
            """
            ),
        ),
        Fix(
            "jax",
            "Drop references to old arrays (and donate buffers you overwrite)",
            snippet(
                """
            import jax

            step = jax.jit(train_step, donate_argnums=(0,))
            state = step(state, batch)  # the old state is not kept
            """
            ),
        ),
    )
    needs_recording = True
    references = (
        (
            "PyTorch FAQ: my model reports cuda runtime error(2): out of memory",
            "https://pytorch.org/docs/stable/notes/faq.html",
        ),
        (
            "PyTorch: understanding CUDA memory usage",
            "https://pytorch.org/docs/stable/torch_cuda_memory.html",
        ),
        ("JAX: buffer donation", "https://jax.readthedocs.io/en/latest/faq.html#buffer-donation"),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is not None and fail.stack_cues.gathering_outputs:
            return self._gathering_outputs(facts, fail)
        if facts.is_text_only:
            return self._from_text(facts, fail) if fail is not None else None
        oom = fail.oom if fail is not None else None
        if fail is not None and facts.handled_when_raised:
            return self._retried_in_handler(facts, fail)
        device = facts.failed_device(oom)
        curve = facts.step_curve(device if device is not None and device >= 0 else None)
        if curve is None:
            return None
        fitted = facts.steady_growth(curve, fail)
        if fitted is None:
            kept = kept_by_evaluation(facts, fail)
            return self._evaluation_kept(facts, fail, kept) if kept is not None else None
        trend, last, held_for = fitted
        if curve.on_host and curve.pid is None:
            by_rank = _by_rank(facts)
            if by_rank is not None:
                curve, trend, last, flat = by_rank
                return self._report(facts, fail, curve, trend, last, flat_ranks=flat)
        return self._report(facts, fail, curve, trend, last, held_for=held_for)

    def _report(
        self,
        facts: Facts,
        fail: Failure | None,
        curve: Curve,
        trend: Trend,
        last: float,
        *,
        flat_ranks: Sequence[int] = (),
        held_for: int = 0,
    ) -> Finding:
        total = facts.curve_capacity(curve, fail.oom if fail else None)
        slope = trend.robust_slope_per_step
        relative = trend.robust_growth / trend.start if trend.start > 0 else 1.0
        span = round(trend.span_steps)
        evidence: list[Evidence] = [
            bytes_evidence("growth per step", slope),
            bytes_evidence(f"growth over {span} steps", trend.robust_growth),
            share_evidence("relative growth", min(relative, 100.0)),
            share_evidence("step boundaries where it went up", trend.rising_fraction),
        ]
        if fail is None and total and last < total:
            evidence.append(
                count_evidence("steps left at this rate", round((total - last) / slope))
            )
        # Growth at almost every boundary for twenty steps or more is decisive on its own.
        sustained = trend.monotonic_fraction >= 0.9 and span >= 20
        signals = Signals.of(
            STRONG if sustained else LIKELY,
            ended_in_failure=fail is not None and not trained_after(curve, fail),
            grew_by_half=relative >= 0.5,
        )
        subject = curve.label[:1].upper() + curve.label[1:] if flat_ranks else f"The {curve.label}"
        summary = (
            f"{subject} at step boundaries grew by {format_bytes(slope)} per step "
            f"over {span} steps ({format_bytes(trend.robust_growth)} in all)."
        )
        if held_for:
            summary += (
                f" It then held that memory, within {1 - HELD_SHARE:.0%}, for the "
                f"{held_for} steps to the end."
            )
        fixes = None
        copies = weight_copies(facts, slope)
        if copies is not None:
            count, model = copies
            summary += (
                f" That is {_copies_words(count)} of the model's weights "
                f"({format_bytes(model)}) a step: something keeps a copy of the weights "
                "every step (a snapshot, a hand-made average, a checkpoint kept in memory)."
            )
            evidence.append(bytes_evidence("the model's weights", model))
            fixes = (*WEIGHT_AVERAGE_FIXES, *self.fixes)
        if flat_ranks:
            others = ", ".join(str(r) for r in flat_ranks)
            summary += f" Rank{'s' if len(flat_ranks) > 1 else ''} {others} stayed flat."
            evidence.append(count_evidence("ranks that stayed flat", len(flat_ranks)))
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            frameworks=facts.frameworks(fail.oom if fail else None),
            extra={"metric": curve.metric, "device": curve.device},
            fixes=fixes,
        )

    def _gathering_outputs(self, facts: Facts, fail: Failure) -> Finding:
        """The evaluation ran out while the `Trainer` added this batch's outputs to all it had
        kept since the evaluation began: it keeps every batch's logits for the metrics."""
        summary = (
            "The evaluation ran out while the Trainer added this batch's outputs to those it "
            "had kept since the evaluation began (nested_concat): it keeps every batch's "
            "logits for compute_metrics until the evaluation ends, so the memory grows batch "
            "after batch."
        )
        evidence = [Evidence(f"ran out in: {innermost_frames(fail, 3)}")]
        if fail.oom.requested_bytes:
            evidence.append(bytes_evidence("requested", fail.oom.requested_bytes))
        phase = None if facts.is_text_only else facts.phase_at(fail.t, fail.pid)
        signals = Signals.of(LIKELY, in_the_loops_evaluation=phase is not None and phase.evaluating)
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm="set preprocess_logits_for_metrics to keep what the metric needs",
            frameworks=["pytorch"],
            fixes=(KEEP_LESS_FOR_METRICS_FIX,),
        )

    def _retried_in_handler(self, facts: Facts, fail: Failure) -> Finding:
        """The program retried inside the `except` block of a memory error, again and again:
        each failed try's traceback kept its frames, and the tensors they held, alive while
        the next try ran."""
        earlier = facts.handled_when_raised
        tries = len(earlier) + 1
        summary = (
            f"The job ran out {tries} times, each retry started inside the `except` block of "
            "the try before: an exception being handled keeps its traceback, and with it the "
            "failed try's frames and every tensor they held, so each try ran beside what all "
            "the failed ones had kept."
        )
        evidence = [count_evidence("memory errors still being handled at the last", tries - 1)]
        first, last = earlier[0].requested_bytes, fail.oom.requested_bytes
        if first and last:
            evidence += [
                bytes_evidence("the first try asked for", first),
                bytes_evidence("the last try asked for", last),
            ]
        signals = Signals.of(
            LIKELY,
            retried_more_than_once=tries >= 3,
            smaller_tries_ran_out=bool(first and last and last < first),
        )
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            frameworks=facts.frameworks(fail.oom),
            fixes=(RETRY_AFTER_THE_HANDLER_FIX, *self.fixes),
        )

    def _evaluation_kept(self, facts: Facts, fail: Failure | None, kept: EvaluationKept) -> Finding:
        """Each evaluation pass kept memory: what it collects across batches."""
        what = (
            "its outputs (logits or predictions kept for a metric), not autograd graphs: the "
            f"{FRAMEWORK_LOOPS.get(kept.source, 'loop')} evaluated with gradients off"
            if kept.gradients_off
            else "its outputs, or the graphs behind them"
        )
        summary = (
            f"Each evaluation pass kept {format_bytes(kept.per_pass_bytes)} more than it "
            f"started with ({kept.keeping} of {kept.passes} passes, "
            f"{format_bytes(kept.total_bytes)} in all): evaluation keeps {what}."
        )
        evidence = [
            bytes_evidence("kept by an evaluation pass (median)", kept.per_pass_bytes),
            count_evidence("evaluation passes that kept memory", kept.keeping),
            bytes_evidence("kept by all evaluation passes", kept.total_bytes),
            bytes_evidence("kept by a training phase (median)", kept.training_per_phase_bytes),
        ]
        signals = Signals.of(
            LIKELY,
            failed_in_evaluation=kept.failed_in_evaluation,
            every_pass_kept=kept.keeping == kept.passes and kept.passes >= 3,
        )
        fixes = [f for f in self.fixes if f.framework != "pytorch"] + [KEEP_FOR_METRICS_FIX]
        if kept.source == "transformers":
            fixes.insert(0, KEEP_LESS_FOR_METRICS_FIX)
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm="look at what the evaluation step appends or stores between batches",
            frameworks=facts.frameworks(fail.oom if fail else None),
            fixes=fixes,
        )

    def _from_text(self, facts: Facts, fail: Failure) -> Finding | None:
        """Text alone cannot show growth: say what would, when the text hints at it."""
        oom = fail.oom
        if (
            oom.kind not in (OomKind.ALLOCATOR, OomKind.DISGUISED)
            or specific_library(oom) is not None
        ):
            return None
        cues = growth_words(fail)
        if cues.kept_for_metrics is not None:
            summary = (
                f'The text names Trainer\'s evaluation ("{cues.kept_for_metrics}"): it keeps every '
                "evaluation batch's logits on the device until the metrics are computed, so "
                "memory grows batch after batch through the evaluation."
            )
            return self.finding(
                facts,
                Signals(POSSIBLE),
                summary,
                [],
                to_confirm=TO_CONFIRM,
                frameworks=["pytorch"],
                fixes=(KEEP_LESS_FOR_METRICS_FIX,),
            )
        reached = cues.progress
        evidence: list[Evidence] = []
        if cues.leak_words is not None:
            signals = Signals(POSSIBLE)
            summary = (
                f'The text itself speaks of a leak ("{cues.leak_words}"): memory that grows each '
                "step until none is left."
            )
        elif reached is not None and reached >= 2:
            signals = Signals(POSSIBLE)
            summary = (
                f"The error came after training had reached {reached} epochs or steps: memory "
                "that grows each step is a common reason for a late failure."
            )
            evidence = [count_evidence("epochs or steps reached", reached)]
        elif oom.requested_bytes is None and oom.total_bytes is None and oom.shape is None:
            signals = Signals(WEAK)
            summary = "The error gives no numbers; memory growing each step is one possible cause."
        else:
            return None
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm=TO_CONFIRM,
            frameworks=facts.frameworks(oom),
        )


def _by_rank(facts: Facts) -> tuple[Curve, Trend, float, list[int]] | None:
    """The rank that grew, when some ranks of a job grew and others did not: its curve,
    trend and last value, and the ranks that stayed flat. None when every rank grew (the
    tree's curve says it) or the trace holds no ranks of their own."""
    grew: list[tuple[Curve, Trend, float]] = []
    flat: list[int] = []
    for rank, curve in facts.rank_curves():
        fitted = facts.steady_growth(curve, None)
        if fitted is None:
            flat.append(rank)
        else:
            grew.append((curve, *fitted[:2]))
    if not grew or not flat:
        return None
    curve, trend, last = max(grew, key=lambda g: g[1].robust_slope_per_step)
    return curve, trend, last, flat


def weight_copies(facts: Facts, per_step: float) -> tuple[int, float] | None:
    """(copies, the model's weight bytes) when the growth per step is a whole number of
    copies of the model's weights (as the framework's model_state events give them)."""
    model = max(
        (float(e.data.get("param_bytes") or 0) for e in facts.trace.events(EventKind.MODEL_STATE)),
        default=0.0,
    )
    if model < MIN_MODEL_BYTES:
        return None
    count = round(per_step / model)
    if not 1 <= count <= MAX_WEIGHT_COPIES:
        return None
    if abs(per_step - count * model) > WEIGHT_COPY_TOLERANCE * model:
        return None
    return count, model


def _copies_words(count: int) -> str:
    return "about one copy" if count == 1 else f"about {count} copies"


RULE = LeakAcrossSteps()
