"""MD010 eval-without-no-grad: evaluation builds autograd graphs it never uses."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memdoc.oom.names import has_stem
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Curve,
    Failure,
    said,
    short_frame,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    snippet,
)
from memdoc.trace.model import Event, Metric
from memdoc.trace.reader import Series
from memdoc.units import format_bytes

# Stems of a phase mark's label that evaluates or samples ("validation", "generate").
_EVAL_LABEL = ("eval", "valid", "predict", "test", "infer", "sampl", "generat")
# Evaluation under no_grad adds roughly one batch of activations; with autograd on it adds
# what training adds. This share of the training rise means the graph was built.
SAME_AS_TRAINING = 0.7
FAR_ABOVE_TRAINING = 2.0  # ... and this many times it is no longer "as much"
INFERRED_RISE_FLOOR = 1 << 20
# Forward passes this many median steps' time after the last step ended, with no step
# since, are no step's own: the program is evaluating (or generating) between steps.
STEPS_WITHOUT_A_STEP = 3


@dataclass(frozen=True)
class _Span:
    label: str
    t0: float
    t1: float


class EvalWithoutNoGrad(RuleSpec):
    slug = "eval-without-no-grad"
    code = "MD010"
    title = "Evaluation builds autograd graphs"
    what = """
Validation, prediction or sampling runs with autograd on. Every forward pass records its
graph and keeps the activations for a backward pass that never comes, so evaluation needs as
much memory as training, or more with a larger batch.
"""
    why = """
`model.eval()` switches dropout and batch norm to inference behaviour; it does not turn off
gradient tracking. Without `torch.no_grad()` or `torch.inference_mode()`, outputs keep their
graph alive for as long as they are referenced, for example in a list of predictions.
"""
    confirm = """
- The error happens in a validate, evaluate, predict or generate function; or, whatever its
  name, in forward passes the program runs long after its last training step (an epoch-end
  hook), with memory rising all the while: possible only, since kept outputs rise too.
- Memory during evaluation rises as much as during a training step (`memdoc run` with
  `memdoc.mark("eval")` before evaluation records it).
- `torch.is_grad_enabled()` is `True` inside the evaluation loop.
- The forward that ran out is a model's in evaluation mode (`model.eval()`) whose frames hold
  tensors with a `grad_fn`: autograd recorded it (memdoc reads both from the error's
  traceback under `memdoc run`). A frozen teacher in distillation is the common case.
- The log has PyTorch's warning "volatile was removed and now has no effect": code written
  for PyTorch before 0.4 still counts on `volatile=True` to turn autograd off.
"""
    fixes = (
        Fix(
            "pytorch",
            "Turn autograd off for evaluation",
            snippet(
                """
            import torch

            model.eval()
            with torch.inference_mode():  # or torch.no_grad()
                for batch in val_loader:
                    outputs = model(batch)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Or decorate the evaluation function",
            snippet(
                """
            import torch

            @torch.no_grad()
            def validate(model, loader):
                ...
            """
            ),
        ),
    )
    needs_recording = True
    references = (
        ("PyTorch: torch.no_grad", "https://pytorch.org/docs/stable/generated/torch.no_grad.html"),
        (
            "PyTorch: torch.inference_mode",
            "https://pytorch.org/docs/stable/generated/torch.inference_mode.html",
        ),
        (
            "PyTorch: locally disabling gradient computation",
            "https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        involved = facts.frameworks(fail.oom if fail else None)
        if involved and "pytorch" not in involved:
            return None  # only PyTorch records graphs during a plain forward pass
        if fail is not None and _gradients_were_off(facts, fail):
            return None  # turning autograd off cannot help where the loop had done it
        if not facts.is_text_only:
            found = self._recorded(facts, fail)
            if found is not None:
                return found
        if fail is None:
            return None
        return (
            self._inference_recording(facts, fail)
            or self._volatile(facts, fail)
            or self._from_frames(facts, fail)
        )

    def _inference_recording(self, facts: Facts, fail: Failure) -> Finding | None:
        """The forward that ran out was a model's in evaluation mode, and autograd was
        recording it (its frames held tensors with a `grad_fn`): inference, or a frozen
        teacher, run without `torch.no_grad()`, whatever the code around it is called."""
        if not _evaluating_with_a_graph(fail):
            return None
        name = _module_name(fail)
        summary = (
            f"The forward pass that ran out was {name}'s, in evaluation mode, with autograd "
            "recording it (the tensors in its frames carry a grad_fn): run without "
            "torch.no_grad(), it keeps every layer's activations for a backward pass that "
            "never comes."
        )
        evidence = [
            Evidence(f"module whose forward ran out: {name}, in evaluation mode"),
            Evidence("autograd recorded its graph: tensors in its frames have a grad_fn"),
        ]
        first_step = not facts.is_text_only and not facts.stepped_before(fail.t)
        phase = None if facts.is_text_only else facts.phase_at(fail.t, fail.pid)
        modules = [] if facts.is_text_only else facts.modules_in_hand
        signals = Signals.of(
            LIKELY,
            in_the_first_step=first_step,
            outside_a_loops_evaluation=phase is None or phase.name != "eval",
            every_error_recorded_a_graph=len(modules) >= 2
            and all(_recording_in_evaluation(m) for m in modules),
        )
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm=f"wrap the call of {name} in `with torch.no_grad():` and run again",
            frameworks=["pytorch"],
        )

    def _volatile(self, facts: Facts, fail: Failure) -> Finding | None:
        """PyTorch 0.4 dropped `volatile=True` and warns when code still passes it: code that
        relied on it to turn autograd off now builds a graph on every inference pass."""
        if not said(fail).volatile:
            return None
        summary = (
            "PyTorch warned that `volatile` has no effect: the code relies on it to turn "
            "autograd off, so every inference pass keeps its graph."
        )
        evidence = [Evidence("PyTorch's warning: volatile was removed and now has no effect")]
        return self.finding(facts, Signals(LIKELY), summary, evidence, frameworks=["pytorch"])

    def _recorded(self, facts: Facts, fail: Failure | None) -> Finding | None:
        device = facts.failed_device(fail.oom if fail else None)
        curve = facts.step_curve(device if device is not None and device >= 0 else None)
        if curve is None or len(curve.steps) < 2:
            return None
        spans = _eval_spans(facts)
        frame = _eval_frame(fail) if fail is not None and not spans else None
        # Evaluation known only from forward passes long after the last step: whether they
        # ran with gradients on is not known (kept outputs grow memory too), so at most
        # possible.
        inferred = False
        if frame is None and fail is not None and not spans:
            frame = _forward_after_last_step(fail, curve)
            inferred = frame is not None
        unmarked = frame is not None
        if fail is not None and frame is not None:
            trained = [s.t_end for s in curve.steps if s.t_end <= fail.t]
            spans = [_Span(frame, trained[-1], fail.t)] if trained else []
        series = facts.trace.series(curve.metric, curve.device, curve.pid)
        peaks = facts.trace.series(curve.metric + "_peak", curve.device, curve.pid)
        rises = [
            s.peak - prev.baseline
            for prev, s in zip(curve.steps, curve.steps[1:], strict=False)
            if s.peak is not None and prev.baseline is not None
        ]
        train_rise = statistics.median(rises) if rises else 0.0
        if inferred:
            # Steps that add nothing measurable (a small model, memory read at boundaries)
            # leave the comparison to the noise of the host's reading.
            train_rise = max(train_rise, INFERRED_RISE_FLOOR)
        if series is None or train_rise <= 0 or not spans:
            return None
        at_error = _read_at_error(curve.metric, curve.pid, fail)
        eval_rise = max(_rise(series, peaks, span, fail, at_error) for span in spans)
        if eval_rise < SAME_AS_TRAINING * train_rise:
            return None
        failed_in_eval = fail is not None and any(s.t0 <= fail.t <= s.t1 for s in spans)
        # A marked span that the error fell in is two facts (the mark, the time); an
        # unmarked one is the frames alone.
        signals = Signals.of(
            LIKELY,
            failed_during_evaluation=failed_in_eval,
            failed_in_marked_evaluation=failed_in_eval and not unmarked,
            evaluation_above_training=eval_rise >= train_rise,
        )
        # The forward that ran out answers the question where it was a model's in
        # evaluation mode and its frames held tensors with a grad_fn.
        recording = fail is not None and _evaluating_with_a_graph(fail)
        if inferred and recording:
            # (the span inferred ends at the failure: failing in it is no further fact)
            signals = Signals.of(LIKELY, evaluation_above_training=eval_rise >= train_rise)
        elif inferred:
            signals = Signals(POSSIBLE)
        where = (
            "in evaluation code after the last training step" if unmarked else "during evaluation"
        )
        compared = (
            f"as much as a training step ({format_bytes(train_rise)})"
            if eval_rise < FAR_ABOVE_TRAINING * train_rise
            else f"where a training step adds {format_bytes(train_rise)}"
        )
        summary = (
            f"Memory rose by {format_bytes(eval_rise)} {where}, {compared}: evaluation kept "
            "autograd graphs."
        )
        evidence = [
            bytes_evidence("rise during evaluation", eval_rise),
            bytes_evidence("rise during a training step (median)", train_rise),
            ratio_evidence("evaluation / training", eval_rise / train_rise),
        ]
        if frame is not None:
            evidence.insert(0, Evidence(f"failed in evaluation code: {frame}"))
        if inferred:
            summary = (
                f"Memory rose by {format_bytes(eval_rise)} in forward passes of {frame}, long "
                f"after the last training step, {compared}: "
                + (
                    f"the one that ran out was {_module_name(fail)}'s in evaluation mode "
                    "with autograd recording it, so each kept its graph."
                    if recording and fail is not None
                    else "if they ran with autograd on, each kept its graph."
                )
            )
            evidence[0] = Evidence(f"forward passes after the last step, in: {frame}")
            if recording:
                evidence.insert(1, Evidence("autograd recorded the forward that ran out"))
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm=(
                f"check that {frame} runs under torch.no_grad(): if it does, what it keeps "
                "(its outputs) is the cause"
            )
            if inferred and not recording
            else None,
            frameworks=["pytorch"],
        )

    def _from_frames(self, facts: Facts, fail: Failure) -> Finding | None:
        if not _in_eval_frames(fail):
            return None
        summary = (
            "The error happened during evaluation or generation; if autograd was on there, "
            "evaluation kept a graph per batch."
        )
        frame = _eval_frame(fail)
        evidence = [Evidence(f"failed in evaluation code: {frame}")] if frame else []
        return self.finding(
            facts,
            Signals.of(POSSIBLE, evaluation_frame_named=frame is not None),
            summary,
            evidence,
            to_confirm=(
                "check that the evaluation code runs under torch.no_grad() or "
                'torch.inference_mode(); `memdoc.mark("eval")` plus `memdoc run` measures it'
            ),
            frameworks=["pytorch"],
        )


def _evaluating_with_a_graph(fail: Failure) -> bool:
    """The forward that ran out was a model's in evaluation mode, recording a graph."""
    return _recording_in_evaluation(fail.module)


def _recording_in_evaluation(module: Mapping[str, Any]) -> bool:
    return module.get("training") is False and module.get("recording_graph") is True


def _module_name(fail: Failure) -> str:
    return str(fail.module.get("module") or "a model")


def _in_eval_frames(fail: Failure) -> bool:
    """The error came from evaluation code that did not turn gradients off."""
    cues = fail.stack_cues
    return (cues.evaluation or fail.oom.phase == "eval") and not cues.grad_off


def _eval_frame(fail: Failure) -> str | None:
    """The evaluation frame the error came from ("train.py:55 evaluate"), if autograd was on."""
    frame = fail.stack_cues.evaluation_frame
    return short_frame(frame) if frame is not None and _in_eval_frames(fail) else None


def _forward_after_last_step(fail: Failure, curve: Curve) -> str | None:
    """The program's frame that ran forward passes, with gradients not turned off by its
    loop, long after the last training step ended (no step since, for as long as several
    steps take): evaluation code of the program's own, whatever its name (a hook at an
    epoch's end). None for the forward pass of a step that simply came next."""
    ended = [s.t_end for s in curve.steps if s.t_end <= fail.t]
    durations = [s.t_end - s.t_start for s in curve.steps if s.t_end > s.t_start]
    if not ended or not durations or fail.stack_cues.phase != "forward":
        return None
    if fail.t - ended[-1] < STEPS_WITHOUT_A_STEP * statistics.median(durations):
        return None
    caller = fail.stack_cues.model_caller  # the code that called the model, not its forward
    return short_frame(caller) if caller is not None else None


def _eval_spans(facts: Facts) -> list[_Span]:
    """Evaluation marks, each lasting until the next mark or step (or the end)."""
    boundaries = sorted([e.t for e in facts.trace.marks()] + list(facts.trace.steps().times()))
    spans: list[_Span] = []
    for mark in facts.trace.marks():
        label = str(mark.data.get("label", ""))
        if not has_stem(label, _EVAL_LABEL) or _grad_off(mark):
            continue
        later = [t for t in boundaries if t > mark.t]
        spans.append(_Span(label, mark.t, later[0] if later else facts.trace.duration_s))
    return spans


def _gradients_were_off(facts: Facts, fail: Failure) -> bool:
    """The error came in a loop phase that ran with gradients off (Lightning's, the
    Trainer's and Keras's evaluation and prediction)."""
    phase = facts.phase_at(fail.t, fail.pid)
    return phase is not None and phase.grad_enabled is False


def _grad_off(mark: Event) -> bool:
    return mark.data.get("grad_enabled") is False


# The failing process's own reading at the error, by the host metric a step curve follows.
_AT_ERROR_KEYS = {Metric.HOST_VMS: "address_space_bytes", Metric.HOST_RSS: "rss_bytes"}


def _read_at_error(metric: str, pid: int | None, fail: Failure | None) -> float | None:
    """What the failing process itself read of `metric` at the error, when the curve is its
    own host memory or its process tree's (which holds at least as much): exact however busy
    the machine, where the last sample before the error may come long before it."""
    key = _AT_ERROR_KEYS.get(metric)
    if fail is None or key is None or pid not in (None, fail.pid):
        return None
    value = fail.host.get(key)
    return float(value) if value else None


def _rise(
    series: Series,
    peaks: Series | None,
    span: _Span,
    fail: Failure | None,
    at_error: float | None,
) -> float:
    """How far memory rose in the span; when the error fell in it, plus what it asked for."""
    start = series.at(span.t0)
    highs = [
        v
        for s in (series, peaks)
        if s is not None and (v := s.max_between(span.t0, span.t1)) is not None
    ]
    failed_here = fail is not None and span.t0 <= fail.t <= span.t1
    if failed_here and at_error is not None:
        highs.append(at_error)
    if start is None or not highs:
        return 0.0
    asked = float(fail.oom.requested_bytes or 0) if fail is not None and failed_here else 0.0
    return max(highs) + asked - start


RULE = EvalWithoutNoGrad()
