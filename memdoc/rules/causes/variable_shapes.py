"""MD017 variable-shapes: changing input shapes keep growing the pool."""

from __future__ import annotations

import statistics

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import said
from memdoc.rules.spec import (
    RuleSpec,
    count_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.model import Metric

MIN_STEPS = 6
# Per-step peaks that vary this much (coefficient of variation) come from varying shapes.
VARYING_PEAKS = 0.15
# A new high of the pool, after warm-up, at this many separate steps.
MIN_NEW_HIGHS = 3


class VariableShapes(RuleSpec):
    slug = "variable-shapes"
    code = "MD017"
    title = "Changing input shapes keep growing the memory pool"
    what = """
Every new input shape (a longer sentence, a bigger image, a different last batch) needs
blocks of new sizes. The caching allocator keeps the old blocks for reuse, so the pool grows
in steps whenever a new shape arrives; XLA and `tf.function` also recompile for each new
shape, each compiled program with its own buffers.
"""
    why = """
Cached blocks sized for one shape fit another shape badly, and freed memory ends up split
between differently sized blocks (fragmentation). Padding to a few fixed sizes lets every
step reuse the same blocks and compiled programs.
"""
    confirm = """
- The pool (reserved memory) rises at many separate steps after the first ones, while
  memory between steps stays flat.
- Peaks vary from step to step with the input length or size.
- TensorFlow warns that `tf.function` retracing was triggered; JAX recompiles (enable
  `jax.config.update("jax_log_compiles", True)`).
"""
    fixes = (
        Fix(
            "pytorch",
            "Pad inputs to a few fixed lengths (buckets)",
            snippet(
                """
            import torch.nn.functional as F

            bucket = 128 * ((seq_len + 127) // 128)
            x = F.pad(x, (0, bucket - seq_len))
            """
            ),
        ),
        Fix(
            "pytorch",
            "Let the pool grow segments in place instead of caching odd-sized blocks",
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "bash",
            gpu_only=True,
        ),
        Fix(
            "tensorflow",
            "Give tf.function a fixed input signature",
            snippet(
                """
            import tensorflow as tf

            @tf.function(input_signature=[tf.TensorSpec([None, 512], tf.int32)])
            def step(x):
                ...
            """
            ),
        ),
        Fix(
            "jax",
            "Pad to fixed shapes so jit compiles once",
            snippet(
                """
            import jax.numpy as jnp

            x = jnp.pad(x, ((0, 0), (0, 512 - x.shape[1])))
            """
            ),
        ),
    )
    needs_recording = True
    references = (
        (
            "PyTorch: CUDA memory management",
            "https://pytorch.org/docs/stable/notes/cuda.html#memory-management",
        ),
        (
            "TensorFlow: controlling retracing",
            "https://www.tensorflow.org/guide/function#controlling_retracing",
        ),
        ("JAX: jit and recompilation", "https://jax.readthedocs.io/en/latest/jit-compilation.html"),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if facts.is_text_only:
            if fail is None or not said(fail).retracing:
                return None
            return self.finding(
                facts,
                Signals(POSSIBLE),
                "The log shows recompilation for new input shapes before the error.",
                [],
                to_confirm="record the pool with `memdoc run`: it rises at each new shape",
                frameworks=facts.frameworks(fail.oom),
            )
        device = facts.failed_device(fail.oom if fail else None)
        curve = facts.step_curve(device if device is not None and device >= 0 else None)
        if curve is None or curve.on_host or len(curve.steps) < MIN_STEPS:
            return None
        peaks = [s.peak for s in curve.steps if s.peak is not None]
        if len(peaks) < MIN_STEPS or statistics.mean(peaks) <= 0:
            return None
        variation = statistics.pstdev(peaks) / statistics.mean(peaks)
        new_highs = _pool_new_highs(
            facts, curve.metric, curve.device, curve.pid, [s.t_end for s in curve.steps]
        )
        if variation < VARYING_PEAKS or new_highs < MIN_NEW_HIGHS:
            return None
        evidence = [
            share_evidence("variation of per-step peaks", variation),
            count_evidence("steps at which the pool grew after warm-up", new_highs),
        ]
        signals = Signals.of(
            LIKELY, ended_in_failure=fail is not None, many_new_highs=new_highs >= 2 * MIN_NEW_HIGHS
        )
        summary = (
            f"The pool grew at {new_highs} separate steps while per-step peaks varied by "
            f"{variation:.0%}: new shapes kept arriving."
        )
        return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks())


def _pool_new_highs(
    facts: Facts, allocated_metric: str, device: int | None, pid: int | None, ends: list[float]
) -> int:
    """Steps (after the first two) at which the pool reached a new high."""
    metric = allocated_metric.rsplit(".", 1)[0] + "." + Metric.RESERVED
    series = facts.trace.series(metric, device, pid)
    if series is None:
        return 0
    highs = 0
    best = series.at(ends[1]) if len(ends) > 1 else None
    for t in ends[2:]:
        value = series.at(t)
        if value is None:
            continue
        if best is None or value > best * 1.01:
            highs += 1 if best is not None else 0
            best = value
    return highs


RULE = VariableShapes()
