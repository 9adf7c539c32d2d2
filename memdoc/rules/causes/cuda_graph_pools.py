"""MD021 cuda-graph-pools: memory held in CUDA-graph private pools."""

from __future__ import annotations

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    said,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.model import Metric
from memdoc.units import format_bytes

# A graph's private pool matters at this share of the device: above SIGNIFICANT_SHARE, since
# a pool always holds a captured step's activations, which are not a waste in themselves.
GRAPH_POOL_SHARE = 0.05


class CudaGraphPools(RuleSpec):
    slug = "cuda-graph-pools"
    code = "MD021"
    title = "Memory held in CUDA-graph private pools"
    what = """
Captured CUDA graphs keep their memory in private pools, separate from the allocator's
shared cache, for as long as the graph exists. Many captured graphs (one per batch size in
an inference server, one per shape with `torch.compile(mode="reduce-overhead")`) hold many
pools that the rest of the program cannot use.
"""
    why = """
A graph replays fixed kernels on fixed addresses, so its inputs, outputs and temporaries
must stay allocated between replays. Pools are shared only when graphs are captured into the
same pool on purpose. Inference servers capture graphs for a list of batch sizes at start-up;
the total can be gigabytes.
"""
    confirm = """
- The PyTorch message says "with X allocated in private pools (e.g., CUDA Graphs)" and X is
  large.
- The failure happens during graph capture (`capture_end`) or right after it.
- `torch.cuda.memory_stats()` private-pool counters, recorded by `memdoc run`, grow with
  each capture.
"""
    fixes = (
        Fix(
            "pytorch",
            "Share one pool between graphs that do not run concurrently",
            snippet(
                """
            import torch

            pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(g1, pool=pool):
                out1 = model(static_in1)
            with torch.cuda.graph(g2, pool=pool):
                out2 = model(static_in2)
            """
            ),
            gpu_only=True,
        ),
        Fix(
            "pytorch",
            "Capture fewer graphs (fewer batch sizes or shapes)",
            'model = torch.compile(model, mode="max-autotune-no-cudagraphs")',
            gpu_only=True,
        ),
        Fix(
            "any",
            "In vLLM, capture fewer sizes or none",
            "vllm serve MODEL --max-seq-len-to-capture 2048 --enforce-eager",
            "bash",
        ),
    )
    references = (
        ("PyTorch: CUDA graphs", "https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs"),
        (
            "PyTorch: torch.compile modes",
            "https://pytorch.org/docs/stable/generated/torch.compile.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return None
        oom = fail.oom
        device = facts.failed_device(oom)
        total = facts.device_total(device, oom)
        private = _private_bytes(facts, fail, device)
        if private and total and private >= max(GRAPH_POOL_SHARE * total, oom.requested_bytes or 0):
            evidence: list[Evidence] = [
                bytes_evidence("allocated in private pools", private),
                share_evidence("share of the device", private / total),
            ]
            large_share = oom.allocated_bytes is not None and private >= 0.25 * oom.allocated_bytes
            summary = (
                f"{format_bytes(private)} were held in CUDA-graph private pools, more than "
                "the failed request."
            )
            return self.finding(
                facts,
                Signals(STRONG if large_share else LIKELY),
                summary,
                evidence,
                frameworks=facts.frameworks(oom),
            )
        if fail.stack_cues.cuda_graph_capture or said(fail).cuda_graph_capture:
            summary = "The error happened while capturing a CUDA graph."
            return self.finding(
                facts,
                Signals(POSSIBLE),
                summary,
                [],
                to_confirm="count the graphs captured (one per batch size or shape)",
                frameworks=facts.frameworks(oom),
            )
        return None


def _private_bytes(facts: Facts, fail: Failure, device: int | None) -> float | None:
    if fail.oom.private_pool_bytes is not None:
        return fail.oom.private_pool_bytes
    if (
        facts.is_text_only
        or device is None
        or not facts.series_named("torch." + Metric.PRIVATE_POOL)
    ):
        return None
    return facts.framework_at(Metric.PRIVATE_POOL, device, fail.t)


RULE = CudaGraphPools()
