"""MD014 optimizer-state: optimizer states appear at the first step and do not fit."""

from __future__ import annotations

from dataclasses import dataclass

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    innermost_frames,
    said,
    short_frame,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.model import KERAS, EventKind
from memdoc.units import format_bytes

# Adam keeps two states per parameter: the first step adds about twice the parameter bytes.
ADAM_RATIO = 2.0
RATIO_TOLERANCE = 0.35


class OptimizerState(RuleSpec):
    slug = "optimizer-state"
    code = "MD014"
    title = "Optimizer states appear at the first step and do not fit"
    what = """
The forward and backward passes fit, but the job fails at the first `optimizer.step()`:
that is when Adam-style optimizers allocate their state, two extra tensors the size of every
parameter (in fp32, even for a bf16 model unless told otherwise).
"""
    why = """
Optimizer state is created lazily. For Adam and AdamW it is twice the parameter bytes (8
bytes per parameter in fp32); the multi-tensor implementation also needs temporary copies
during the update. A model that trains comfortably with SGD can fail with Adam.
"""
    confirm = """
- The error is raised inside `optimizer.step()` (`torch/optim/adam.py`, `_init_group`) or,
  in TensorFlow, while creating `Adam` slot variables. An error in a closure that the step
  calls (Lightning's `training_step`, `optimizer.step(closure)`) is the forward or backward
  pass, not the optimizer's state.
- Memory jumps at the first step by about twice the parameter bytes (`memdoc run` records
  parameter and optimizer-state bytes).
"""
    fixes = (
        Fix(
            "pytorch",
            "Use an 8-bit optimizer",
            snippet(
                """
            import bitsandbytes as bnb

            optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Avoid the multi-tensor update's temporaries",
            snippet(
                """
            import torch

            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Shard optimizer state across ranks",
            snippet(
                """
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(
                model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4
            )
            """
            ),
        ),
        Fix(
            "pytorch",
            "Use an optimizer without per-parameter state",
            snippet(
                """
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.0)
            """
            ),
        ),
        Fix(
            KERAS,
            "Use an optimizer with factored state",
            snippet(
                """
            import keras

            # a row and a column of second moments per matrix, not two copies of it
            model.compile(optimizer=keras.optimizers.Adafactor(learning_rate=1e-3), loss=loss)
            """
            ),
        ),
        Fix(
            KERAS,
            "Use an optimizer without per-weight state",
            snippet(
                """
            import keras

            model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-2), loss=loss)
            """
            ),
        ),
        Fix(
            "jax",
            "Use a factored optimizer with smaller state",
            snippet(
                """
            import optax

            optimizer = optax.adafactor(learning_rate=1e-3)
            """
            ),
        ),
    )
    references = (
        ("PyTorch: torch.optim", "https://pytorch.org/docs/stable/optim.html"),
        (
            "bitsandbytes: 8-bit optimizers",
            "https://huggingface.co/docs/bitsandbytes/main/en/optimizers",
        ),
        (
            "PyTorch: ZeroRedundancyOptimizer",
            "https://pytorch.org/docs/stable/distributed.optim.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if _a_smaller_batch_trained(facts):
            return None
        if not facts.is_text_only:
            found = self._recorded(facts, fail)
            if found is None and fail is not None:
                found = self._handed_to_a_jitted_step(facts, fail)
            if found is not None:
                return found
        if fail is None or fail.stack_cues.optimizer_closure:
            return None
        in_optimizer = fail.stack_cues.optimizer or said(fail).optimizer_state
        if not in_optimizer:
            return None
        creating = fail.stack_cues.making_optimizer_state
        first = not facts.is_text_only and not facts.stepped_before(fail.t)
        if creating and first and fail.stack_cues.own_optimizer_state is not None:
            summary = (
                "The error happened while the program created its optimizer's state, before "
                "its first step had finished."
            )
        elif creating and first:
            summary = (
                "The error happened while the optimizer created its state, in the first step: "
                "forward and backward fitted, the state did not."
            )
        else:
            summary = "The error happened while the optimizer created or updated its state."
        evidence = [Evidence(f"failed in: {innermost_frames(fail, 1)}")] if fail.stack else []
        if fail.stack_cues.own_optimizer_state is not None:
            made_in = short_frame(fail.stack_cues.own_optimizer_state)
            evidence.append(Evidence(f"the optimizer's state made in: {made_in}"))
        return self.finding(
            facts,
            Signals.of(LIKELY, creating_state_at_first_step=creating and first),
            summary,
            evidence,
            to_confirm=(
                "compare the optimizer's state (2x the parameters for Adam) with what is "
                "free after backward"
            ),
            frameworks=facts.frameworks(fail.oom),
        )

    def _recorded(self, facts: Facts, fail: Failure | None) -> Finding | None:
        recorded = _model_state(facts)
        if not recorded.params:
            return None
        params, device = recorded.params, recorded.device
        jump = recorded.state or _first_step_jump(facts)
        if not jump:
            return None
        ratio = jump / params
        adam_like = abs(ratio - ADAM_RATIO) <= RATIO_TOLERANCE * ADAM_RATIO
        total = facts.trace.device_total_bytes(device) if device is not None else None
        steps = facts.trace.steps()
        failed_first = (
            fail is not None
            and not fail.stack_cues.optimizer_closure
            and (not steps or fail.t <= steps[0].t)
        )
        if not adam_like and not failed_first:
            return None
        evidence: list[Evidence] = [
            bytes_evidence("parameters", params),
            bytes_evidence("added at the first step", jump),
            ratio_evidence("added / parameters", ratio),
        ]
        if total:
            evidence.append(share_evidence("optimizer state / device", jump / total))
        if failed_first and fail is not None and recorded.made_before(fail.t):
            return self._made_before_the_step(facts, fail, recorded, ratio, adam_like)
        if failed_first:
            signals = Signals(STRONG if adam_like else LIKELY)
            summary = (
                f"The first optimizer step adds {format_bytes(jump)} ({ratio:.1f}x the "
                "parameters) and the job failed there."
            )
        elif total and jump >= 0.25 * total:
            signals = Signals(POSSIBLE)
            summary = (
                f"Optimizer state takes {format_bytes(jump)}, {jump / total:.0%} of the device."
            )
        else:
            return None
        return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks())

    def _handed_to_a_jitted_step(self, facts: Facts, fail: Failure) -> Finding | None:
        """JAX: the first call of a jitted step, handed the optimizer's state with its
        arguments, ran out; the state is the cause when, without it, the request would have
        fit."""
        state = fail.optimizer_state_bytes
        if not state or not fail.jitted_call:
            return None
        if facts.stepped_before(fail.t):
            return None  # a step ran with this state: what changed since is the cause
        short = facts.shortfall_at_failure(fail)
        requested = fail.oom.requested_bytes
        if short is not None and state < short:
            return None  # freeing all of it would not have made room: not the cause
        if short is None and not (requested and requested <= state):
            return None  # the request was larger than the state, or unknown
        summary = (
            f"The jitted `{fail.jitted_call}` was handed the optimizer's state, "
            f"{format_bytes(state)}, with its arguments, and its first call ran out"
            + (f" asking for {format_bytes(requested)}" if requested else "")
            + "."
        )
        evidence = [
            Evidence(f"jitted call: {fail.jitted_call}"),
            bytes_evidence("optimizer state among its arguments", state),
        ]
        arguments = fail.compiled.get("argument")
        if arguments:
            evidence.append(bytes_evidence("all its arguments", arguments))
            evidence.append(share_evidence("optimizer state / arguments", state / arguments))
        if short is not None:
            summary += (
                f" It was {format_bytes(short)} short: without the state the request would "
                "have fit."
            )
            evidence.append(bytes_evidence("short of the request", short))
        else:
            summary += " The state alone was larger than the request."
        signals = Signals.of(
            LIKELY,
            room_without_the_state=short is not None,
            failed_before_steps=True,
        )
        return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks())

    def _made_before_the_step(
        self, facts: Facts, fail: Failure, recorded: _Recorded, ratio: float, adam_like: bool
    ) -> Finding | None:
        """The loop made the optimizer's state before its first step (Keras `fit` builds it
        then), and that step ran out: the state is the cause when, without it, the failed
        request would have fit."""
        state = recorded.state
        short = facts.shortfall_at_failure(fail)
        if short is not None and state < short:
            return None  # freeing all of it would not have made room: not the cause
        where = fail.stack_cues.phase
        requested = fail.oom.requested_bytes
        summary = (
            f"The optimizer's state, {format_bytes(state)} ({ratio:.1f}x the parameters), "
            "was made before the first step, and that step ran out"
            + (f" in its {where} pass" if where else "")
            + (f" asking for {format_bytes(requested)}" if requested else "")
            + "."
        )
        evidence = [
            bytes_evidence("optimizer state made before the first step", state),
            ratio_evidence("optimizer state / parameters", ratio),
        ]
        if short is not None:
            summary += (
                f" It was {format_bytes(short)} short: without the state the "
                "request would have fit."
            )
            evidence.append(bytes_evidence("short of the request", short))
        signals = Signals.of(
            STRONG if adam_like and short is not None else LIKELY,
            room_without_the_state=short is not None,
        )
        # A Keras loop's optimizer is changed in Keras's own API, whatever its backend.
        named = [KERAS] if recorded.source == KERAS else facts.frameworks()
        return self.finding(facts, signals, summary, evidence, frameworks=named)


@dataclass(frozen=True)
class _Recorded:
    params: float = 0.0
    state: float = 0.0
    device: int | None = None
    # When a loop recorded the optimizer's state as built before its first step (Keras
    # `fit` builds it at its start), and which loop; a PyTorch optimizer's state is recorded
    # after the first step that made it.
    built_t: float | None = None
    source: str | None = None

    def made_before(self, t: float) -> bool:
        return self.built_t is not None and self.built_t <= t


def _model_state(facts: Facts) -> _Recorded:
    """Parameter and optimizer-state bytes and the device, from the latest model_state
    event; when a loop first recorded the state as built before its first step."""
    params = state = 0.0
    device: int | None = None
    built_t: float | None = None
    source: str | None = None
    for event in facts.trace.events(EventKind.MODEL_STATE):
        params = float(event.data.get("param_bytes") or params)
        state = float(event.data.get("optimizer_state_bytes") or state)
        built = event.data.get("optimizer_state_bytes") and event.data.get("phase") == "fit"
        if built and built_t is None:
            built_t, source = event.t, event.data.get("source")
        if isinstance(event.data.get("device"), int):
            device = event.data["device"]
    return _Recorded(params, state, device, built_t, source)


def _first_step_jump(facts: Facts) -> float | None:
    curve = facts.step_curve()
    if curve is None or len(curve.steps) < 2:
        return None
    first, second = curve.steps[0], curve.steps[1]
    series = facts.trace.series(curve.metric, curve.device, curve.pid)
    before = series.at(first.t_start) if series is not None else None
    if before is None or first.baseline is None or second.baseline is None:
        return None
    return first.baseline - before


def _a_smaller_batch_trained(facts: Facts) -> bool:
    """A batch-size search ran out at larger sizes and trained at a smaller one: what did
    not fit grew with the batch, which the optimizer's state (one or two copies of the
    weights, whatever the batch) does not."""
    if facts.is_text_only:
        return False
    search = facts.batch_search
    return search is not None and bool(search.ran_out) and search.trained is not None


RULE = OptimizerState()
