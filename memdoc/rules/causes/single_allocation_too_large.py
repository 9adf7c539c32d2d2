"""MD012 single-allocation-too-large: one request larger than the device could ever give."""

from __future__ import annotations

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.facts import device_total, failed_device, failure, framework_at, frameworks
from memdoc.rules.spec import (
    LIKELY,
    STRONG,
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    ratio_text,
    snippet,
)
from memdoc.trace.model import Metric, OomInfo
from memdoc.trace.reader import Trace
from memdoc.units import format_bytes

# A request this many times the device is not a batch that is a little too big.
ABSURD_RATIO = 10.0


class SingleAllocationTooLarge(RuleSpec):
    slug = "single-allocation-too-large"
    code = "MD012"
    title = "One request is larger than the device could ever give"
    what = """
A single allocation asks for more memory than the GPU has, or more than it could have next
to what the job must keep. No batch-size tuning of the rest of the program helps: this one
tensor has to shrink.
"""
    why = """
The usual sources: a shape bug (a broadcast that multiplies two large dimensions, a wrong
`view`, an integer overflow that yields a size of exbibytes), attention or logits tensors
that grow with the square of the sequence length or with the vocabulary, a whole image or
volume processed at once, or a convolution asking for a huge workspace.
"""
    confirm = """
- "Tried to allocate" is larger than the "total capacity", or absurd (thousands of GiB).
- The shape in the message, or of the tensor created on the failing line, has a dimension
  you did not expect.
- The request shrinks fourfold when the sequence length or tile size halves: a quadratic
  tensor.
"""
    fixes = (
        Fix(
            "pytorch",
            "Check the shape that is being allocated",
            snippet(
                """
            print(q.shape, k.shape)  # (batch, heads, seq, dim) as expected?
            scores = q @ k.transpose(-2, -1)  # (batch, heads, seq, seq): quadratic in seq
            """
            ),
        ),
        Fix(
            "pytorch",
            "Use memory-efficient attention instead of materializing the score matrix",
            snippet(
                """
            import torch.nn.functional as F

            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            """
            ),
        ),
        Fix(
            "pytorch",
            "Process large inputs in chunks or tiles",
            "outputs = [model(chunk) for chunk in inputs.split(1024, dim=0)]",
        ),
        Fix(
            "jax",
            "Map over chunks instead of one huge vectorized call",
            snippet(
                """
            import jax

            out = jax.lax.map(f, xs.reshape(-1, 1024, *xs.shape[1:]))
            """
            ),
        ),
    )
    references = (
        (
            "PyTorch: scaled_dot_product_attention",
            "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html",
        ),
        (
            "PyTorch: understanding CUDA memory usage",
            "https://pytorch.org/docs/stable/torch_cuda_memory.html",
        ),
        ("JAX: jax.lax.map", "https://jax.readthedocs.io/en/latest/_autosummary/jax.lax.map.html"),
    )

    def check(self, trace: Trace) -> Finding | None:
        fail = failure(trace)
        if fail is None:
            return None
        oom = fail.oom
        involved = frameworks(trace, oom)
        if oom.requested_unknown_huge:
            summary = (
                "The requested size is absurd (beyond any device): a size computation went wrong."
            )
            evidence = [Evidence("requested: more than any device has", None, "bytes")]
            return self.finding(trace, STRONG + 0.1, summary, evidence, frameworks=involved)
        requested = oom.requested_bytes
        device = failed_device(trace, oom)
        total = device_total(trace, device, oom)
        if not requested or not total:
            return None
        evidence = [
            bytes_evidence("requested in one allocation", requested),
            bytes_evidence("device total", total),
            ratio_evidence("request / device", requested / total),
        ]
        if requested > total:
            ratio = requested / total
            absurd = ratio >= ABSURD_RATIO
            summary = (
                f"One allocation of {format_bytes(requested)} is {ratio_text(ratio)} the whole "
                f"{format_bytes(total)} device"
                + (": likely a shape or size bug." if absurd else ".")
            )
            return self.finding(
                trace, STRONG + (0.1 if absurd else 0.0), summary, evidence, frameworks=involved
            )
        kept = _kept_bytes(trace, oom, device, fail.t)
        if kept is not None and requested > total - kept and requested >= 0.5 * total:
            evidence.append(bytes_evidence("already allocated by the job", kept))
            summary = (
                f"One allocation of {format_bytes(requested)} is more than the device has left "
                f"beside the {format_bytes(kept)} the job keeps."
            )
            return self.finding(trace, LIKELY - 0.05, summary, evidence, frameworks=involved)
        return None


def _kept_bytes(trace: Trace, oom: OomInfo, device: int | None, t: float) -> float | None:
    if oom.allocated_bytes is not None:
        return oom.allocated_bytes
    if oom.bfc_in_use_bytes is not None:
        return oom.bfc_in_use_bytes
    if trace.is_text_only or device is None:
        return None
    return framework_at(trace, Metric.ALLOCATED, device, t)


RULE = SingleAllocationTooLarge()
