"""MD012 single-allocation-too-large: one request larger than the device could ever give."""

from __future__ import annotations

import dataclasses

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.causes.xla_temp_buffers import made_inside_the_program
from memdoc.rules.confidence import CAPPED, LIKELY, POSSIBLE, STRONG, Signals, capped
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    device_name,
    planned_by_xla,
)
from memdoc.rules.host import (
    Held,
    Limit,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    ratio_text,
    share_evidence,
    snippet,
)
from memdoc.trace.model import Metric, OomInfo
from memdoc.units import format_bytes, format_percent

# A request this many times the device is not a batch that is a little too big.
ABSURD_RATIO = 10.0
# Below the limit, a request at least this many times all the data held is what did not fit.
DOMINANT_RATIO = 1.0
SIZEABLE_SHARE = 0.25
# The most memory one accelerator has today (288 GB of HBM3e): a request above it fits no
# device, whatever device the error text forgot to name.
LARGEST_DEVICE_BYTES = 288 * 10**9
# The job held at most this share of the request: the request alone is the problem.
ALONE_SHARE = 0.1


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
- "Tried to allocate" is larger than the "total capacity", or, where the text names no
  device, larger than any accelerator has (288 GB today), or absurd (thousands of GiB).
- In host memory the capacity is the tightest of RAM, the container's limit and the
  process's address-space cap (`ulimit -v`); `memdoc run` records all three.
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

    def check(self, facts: Facts) -> Finding | None:
        found = self._check(facts)
        fail = facts.failure
        if found is None or fail is None:
            return found
        if not (planned_by_xla(fail.oom) or made_inside_the_program(facts, fail)):
            return found
        if fail.oom.requested_unknown_huge:
            return found
        # XLA's buffer plan is the program's working memory: batch size and remat change it.
        summary = (
            found.summary + " It is the compiled program's working memory, which a smaller "
            "batch or rematerialisation shrinks: see xla-temp-buffers first."
        )
        confidence = capped(found.confidence, POSSIBLE)
        reasons = found.reasons
        if confidence != found.confidence:
            reasons = (*reasons, f"{CAPPED}XLA's plan is the program's working memory")
        return dataclasses.replace(found, confidence=confidence, summary=summary, reasons=reasons)

    def _check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return None
        oom = fail.oom
        involved = facts.frameworks(oom)
        if oom.requested_unknown_huge:
            summary = (
                "The requested size is absurd (beyond any device): a size computation went wrong."
            )
            evidence = [Evidence("requested: more than any device has", None, "bytes")]
            return self.finding(
                facts, Signals.of(STRONG, absurd=True), summary, evidence, frameworks=involved
            )
        requested = oom.requested_bytes
        if not requested:
            return None
        if facts.on_host(oom):
            return self._on_host(facts, fail, requested, involved)
        device = facts.failed_device(oom)
        total = facts.device_total(device, oom)
        if not total:
            largest = Limit("largest accelerator made", LARGEST_DEVICE_BYTES)
            return self._beyond(facts, largest, requested, involved)
        capacity = Limit(f"{device_name(device)} total", total)
        found = self._beyond(facts, capacity, requested, involved)
        if found is not None:
            return found
        kept = _kept_bytes(facts, oom, device, fail.t)
        if kept is None:
            return None
        held = Held("already allocated by the job", kept)
        return self._beside_kept(facts, capacity, requested, held, involved) or self._alone(
            facts, capacity, requested, held, involved
        )

    def _alone(
        self,
        facts: Facts,
        capacity: Limit,
        requested: float,
        held: Held,
        involved: list[str],
    ) -> Finding | None:
        """Most of the device asked for at once while the job held next to nothing: one
        tensor is the problem, not memory piling up (it could fit only on an empty card)."""
        total = capacity.limit_bytes
        if not (requested >= 0.5 * total and held.held_bytes <= ALONE_SHARE * requested):
            return None
        evidence = [
            bytes_evidence("requested in one allocation", requested),
            share_evidence(f"request / {capacity.label}", requested / total),
            bytes_evidence(held.label, held.held_bytes),
        ]
        summary = (
            f"One allocation of {format_bytes(requested)}, {requested / total:.0%} of the "
            f"device, was asked for while the job held only {format_bytes(held.held_bytes)}: "
            "one tensor this large fits only on a nearly empty card."
        )
        return self.finding(facts, Signals(POSSIBLE), summary, evidence, frameworks=involved)

    def _on_host(
        self, facts: Facts, fail: Failure, requested: float, involved: list[str]
    ) -> Finding | None:
        """In host memory the limit is the tightest of an allocator's own limit, the
        process's address-space cap, the cgroup and RAM."""
        oom = fail.oom
        own = oom.total_bytes or oom.limit_bytes or oom.bfc_limit_bytes
        if own:
            found = self._beyond(facts, Limit("allocator limit", own), requested, involved)
            kept = _kept_bytes(facts, oom, oom.device, fail.t)
            if found is None and kept is not None:
                held = Held("in use in the allocator", kept)
                found = self._beside_kept(
                    facts, Limit("allocator limit", own), requested, held, involved
                )
            if found is not None or facts.is_text_only:
                return found
        limits = [] if facts.is_text_only else facts.host_limits(fail.pid, fail.host)
        if not limits:
            return None
        tightest = limits[0]
        found = self._beyond(facts, tightest, requested, involved) or self._beyond_room(
            facts, fail, requested, involved
        )
        resident = facts.resident_at_failure(fail)
        if found is None and resident is not None:
            held = Held("resident memory of the process", resident)
            found = self._beside_kept(facts, tightest, requested, held, involved)
        return found or self._dominant(facts, fail, tightest, requested, involved)

    def _beyond(
        self, facts: Facts, capacity: Limit, requested: float, involved: list[str]
    ) -> Finding | None:
        """The request alone is more than the whole capacity."""
        if requested <= capacity.limit_bytes:
            return None
        ratio = requested / capacity.limit_bytes
        absurd = ratio >= ABSURD_RATIO
        summary = (
            f"One allocation of {format_bytes(requested)} is {ratio_text(ratio)} the whole "
            f"{format_bytes(capacity.limit_bytes)} {capacity.label}"
            + (": likely a shape or size bug." if absurd else ".")
        )
        evidence = [
            bytes_evidence("requested in one allocation", requested),
            bytes_evidence(capacity.label, capacity.limit_bytes),
            ratio_evidence(f"request / {capacity.label}", ratio),
        ]
        signals = Signals.of(STRONG, absurd=absurd)
        return self.finding(facts, signals, summary, evidence, frameworks=involved)

    def _beyond_room(
        self,
        facts: Facts,
        fail: Failure,
        requested: float,
        involved: list[str],
    ) -> Finding | None:
        """Under an address-space cap: one request of a sizeable share of the cap, larger
        than the room the process had left (the cap minus its address space in use). A
        small request failing in a nearly full space is an accumulation, not this."""
        under_cap = facts.address_space_room(fail)
        if under_cap is None:
            return None
        cap, in_use, room = under_cap
        if requested <= room or requested < SIZEABLE_SHARE * cap.limit_bytes:
            return None
        evidence = [
            bytes_evidence("requested in one allocation", requested),
            bytes_evidence(cap.label, cap.limit_bytes),
            bytes_evidence("address space already in use", in_use),
            bytes_evidence("room left under the cap", room),
            share_evidence(f"request / {cap.label}", requested / cap.limit_bytes),
        ]
        summary = (
            f"One allocation of {format_bytes(requested)}, "
            f"{format_percent(requested / cap.limit_bytes)} of the {format_bytes(cap.limit_bytes)} "
            f"{cap.label}, did not fit in the {format_bytes(room)} left under it."
        )
        # Much of an address space is the runtime's own code and reservations: a request
        # larger than all the data the program held is this one tensor, not what piled up.
        held = facts.data_held
        dwarfs = held is not None and requested >= DOMINANT_RATIO * held.held_bytes
        if held is not None and dwarfs:
            evidence.append(bytes_evidence(held.label, held.held_bytes))
            summary += (
                f" It is more than all the data the program held ({format_bytes(held.held_bytes)})."
            )
        signals = Signals.of(LIKELY, more_than_all_data_held=dwarfs)
        return self.finding(facts, signals, summary, evidence, frameworks=involved)

    def _beside_kept(
        self,
        facts: Facts,
        capacity: Limit,
        requested: float,
        held: Held,
        involved: list[str],
    ) -> Finding | None:
        """The request is most of the capacity, and more than what the job's own memory left."""
        total = capacity.limit_bytes
        kept = held.held_bytes
        if not (requested > total - kept and requested >= 0.5 * total):
            return None
        evidence = [
            bytes_evidence("requested in one allocation", requested),
            bytes_evidence(capacity.label, total),
            ratio_evidence(f"request / {capacity.label}", requested / total),
            bytes_evidence(held.label, kept),
        ]
        summary = (
            f"One allocation of {format_bytes(requested)} is more than the "
            f"{format_bytes(total)} {capacity.label} has left beside the "
            f"{format_bytes(kept)} the job keeps."
        )
        # Possible, not likely: in real threads a request this size beside what the job kept
        # was settled by a smaller input or batch more often than by a fix of the one tensor.
        return self.finding(facts, Signals(POSSIBLE), summary, evidence, frameworks=involved)

    def _dominant(
        self, facts: Facts, fail: Failure, limit: Limit, requested: float, involved: list[str]
    ) -> Finding | None:
        """Below the limit, but larger than all the data the program held: this one request,
        not an accumulation, is what did not fit."""
        held = facts.data_held
        if held is None or requested < DOMINANT_RATIO * held.held_bytes:
            return None
        evidence = [
            bytes_evidence("requested in one allocation", requested),
            bytes_evidence(held.label, held.held_bytes),
            ratio_evidence(f"request / {held.label}", requested / held.held_bytes),
            bytes_evidence(limit.label, limit.limit_bytes),
            share_evidence(f"request / {limit.label}", requested / limit.limit_bytes),
        ]
        summary = (
            f"One allocation of {format_bytes(requested)}, more than all the data the program "
            f"held ({format_bytes(held.held_bytes)}), failed under the "
            f"{format_bytes(limit.limit_bytes)} {limit.label}."
        )
        sizeable = requested >= SIZEABLE_SHARE * limit.limit_bytes
        return self.finding(
            facts,
            Signals.of(POSSIBLE, sizeable=sizeable),
            summary,
            evidence,
            to_confirm=(
                "compare the request with the memory the process may use (`ulimit -v`, the "
                "container's limit, RAM) minus what the runtime itself takes"
            ),
            frameworks=involved,
        )


def _kept_bytes(facts: Facts, oom: OomInfo, device: int | None, t: float) -> float | None:
    if oom.allocated_bytes is not None:
        return oom.allocated_bytes
    if oom.bfc_in_use_bytes is not None:
        return oom.bfc_in_use_bytes
    if facts.is_text_only or device is None:
        return None
    return facts.framework_at(Metric.ALLOCATED, device, t)


RULE = SingleAllocationTooLarge()
