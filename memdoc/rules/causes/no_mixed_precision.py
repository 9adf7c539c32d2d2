"""MD015 no-mixed-precision: fp32 everywhere, where bf16/fp16 would halve the memory."""

from __future__ import annotations

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import POSSIBLE, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.rules.spec import RuleSpec, bytes_evidence, share_evidence, snippet
from memdoc.trace.model import EventKind
from memdoc.units import MiB

# Names frameworks print for 32- and 64-bit floats, and their size in bytes.
_WIDE_FLOATS = {
    "float32": 4,
    "float": 4,
    "f32": 4,
    "fp32": 4,
    "torch.float32": 4,
    "double": 8,
    "float64": 8,
    "f64": 8,
}
FP32_DOMINATES = 0.9
# Below this share of what the program held at the failure, the weights with their
# gradients and optimizer state are too small for halving them to change the outcome (a
# 2 MiB model that died of a 700 MiB leak).
MODEL_SHARE_THAT_MATTERS = 0.1
LARGE_REQUEST_BYTES = 256 * MiB


class NoMixedPrecision(RuleSpec):
    slug = "no-mixed-precision"
    code = "MD015"
    title = "Full fp32 where bf16 or fp16 would halve the memory"
    what = """
Weights, activations and the failing tensors are 32-bit floats. Mixed precision (bf16 or
fp16 compute with fp32 master weights where needed) halves activation memory and often the
weights too, on every GPU since Volta.
"""
    why = """
Frameworks default to fp32. Activations saved for backward dominate training memory, and
they take the compute dtype: running the forward pass under autocast or a mixed-precision
policy stores them in 16 bits.
"""
    confirm = """
- The failing tensor's dtype is `float`/`float32`/`f32` (TensorFlow and XLA messages name it).
- Nearly all parameter bytes are fp32 (`memdoc run` records bytes per dtype).
"""
    fixes = (
        Fix(
            "pytorch",
            "Autocast the forward pass to bf16",
            snippet(
                """
            import torch

            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = model(batch)
            loss.backward()
            """
            ),
        ),
        Fix(
            "tensorflow",
            "Use a mixed-precision policy",
            snippet(
                """
            import tensorflow as tf

            tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
            """
            ),
        ),
        Fix(
            "jax",
            "Compute in bf16",
            snippet(
                """
            import jax
            import jax.numpy as jnp

            params = jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params)
            """
            ),
        ),
    )
    references = (
        ("PyTorch: automatic mixed precision", "https://pytorch.org/docs/stable/amp.html"),
        ("TensorFlow: mixed precision", "https://www.tensorflow.org/guide/mixed_precision"),
        ("JAX: jax.numpy dtypes", "https://jax.readthedocs.io/en/latest/jax.numpy.html"),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if not facts.is_text_only:
            found = self._from_dtypes(facts, fail)
            if found is not None:
                return found
        if fail is None:
            return None
        oom = fail.oom
        width = _WIDE_FLOATS.get((oom.dtype or "").lower())
        if width is None or _half_still_too_large(facts, fail):
            return None
        requested = oom.requested_bytes or 0
        large = requested >= LARGE_REQUEST_BYTES or (
            oom.total_bytes is not None and requested >= 0.05 * oom.total_bytes
        )
        if not large and oom.shape is None:
            return None
        evidence: list[Evidence] = [
            Evidence(f"failing tensor dtype: {oom.dtype}", float(width), "bytes per element")
        ]
        if requested:
            evidence.append(bytes_evidence("requested", requested))
        summary = f"The failing tensor is {oom.dtype}: in bf16 or fp16 it would take half as much."
        return self.finding(
            facts,
            Signals.of(WEAK, large_request=large),
            summary,
            evidence,
            to_confirm="check whether the model already runs under autocast or a mixed policy",
            frameworks=facts.frameworks(oom),
        )

    def _from_dtypes(self, facts: Facts, fail: Failure | None) -> Finding | None:
        if fail is None or _model_too_small_to_matter(facts, fail):
            return None
        for event in facts.trace.events(EventKind.MODEL_STATE):
            by_dtype = event.data.get("dtype_bytes")
            if not isinstance(by_dtype, dict) or not by_dtype:
                continue
            total = sum(float(v) for v in by_dtype.values() if isinstance(v, (int, float)))
            fp32 = sum(
                float(v)
                for k, v in by_dtype.items()
                if str(k).lower() in _WIDE_FLOATS and isinstance(v, (int, float))
            )
            if total <= 0 or fp32 / total < FP32_DOMINATES:
                continue
            evidence = [
                bytes_evidence("fp32 parameter bytes", fp32),
                share_evidence("fp32 share of parameters", fp32 / total),
            ]
            summary = (
                f"{fp32 / total:.0%} of the parameter bytes are fp32 and the job ran out of memory."
            )
            return self.finding(
                facts, Signals(POSSIBLE), summary, evidence, frameworks=facts.frameworks()
            )
        return None


def _half_still_too_large(facts: Facts, fail: Failure) -> bool:
    """Half the failed request is still more than all the memory it could have had (a
    360 GB product under a 3 GiB cap): a narrower dtype could not have saved the run."""
    requested = fail.oom.requested_bytes
    capacity = facts.capacity_at_failure(fail)
    return requested is not None and capacity is not None and requested / 2 > capacity


def _model_too_small_to_matter(facts: Facts, fail: Failure) -> bool:
    """The largest model state recorded (weights, gradients, optimizer state) is a small
    share of what the program held when it failed: halving it could not have saved the run.
    False when what was held is not known."""
    held = facts.data_held
    if held is None:
        return False
    model = max(
        (
            sum(
                float(e.data.get(k) or 0)
                for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")
            )
            for e in facts.trace.events(EventKind.MODEL_STATE)
        ),
        default=0.0,
    )
    return model < MODEL_SHARE_THAT_MATTERS * held.held_bytes


RULE = NoMixedPrecision()
