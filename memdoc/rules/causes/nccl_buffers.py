"""MD022 nccl-buffers: NCCL communicator buffers take the memory."""

from __future__ import annotations

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    snippet,
)
from memdoc.trace.model import Metric, framework_metric
from memdoc.units import MiB, format_bytes

# Growth of memory outside the framework's pool that points at communicator buffers.
OUTSIDE_GROWTH_BYTES = 400 * MiB


class NcclBuffers(RuleSpec):
    slug = "nccl-buffers"
    code = "MD022"
    title = "NCCL communicator buffers take the memory"
    what = """
NCCL allocates device buffers for every communicator (process group) at the first
collective on it: typically 0.5 to 0.7 GB per process, outside the framework's allocator.
Several process groups, or a GPU already full, make NCCL fail with "Cuda failure 'out of
memory'", an "unhandled cuda error", or a plain CUDA out-of-memory inside a collective.
"""
    why = """
Buffers are sized by NCCL's channel and buffer settings and multiplied by the number of
communicators (data, tensor and pipeline parallel groups each have their own). The framework
does not see this memory, so its statistics look fine while the device is full.
"""
    confirm = """
- The log contains `NCCL WARN Cuda failure 'out of memory'` or "Failed to CUDA calloc";
  rerun with `NCCL_DEBUG=INFO` to see the allocation.
- The error is raised in `barrier`, `all_reduce`, `init_process_group` or `new_group`.
- The process's device memory outside the framework's pool grows at the first collective
  (`memdoc run` records both).
"""
    fixes = (
        Fix("any", "See what NCCL allocates", "export NCCL_DEBUG=INFO", "bash"),
        Fix(
            "any",
            "Smaller NCCL buffers (slower collectives)",
            snippet(
                """
            export NCCL_BUFFSIZE=2097152
            export NCCL_NCHANNELS_PER_NET_PEER=1
            """
            ),
            "bash",
        ),
        Fix(
            "pytorch",
            "Create fewer process groups and reuse them",
            snippet(
                """
            import torch.distributed as dist

            group = dist.new_group(ranks)  # once, not per call
            """
            ),
        ),
        Fix(
            "jax",
            "Leave memory outside JAX's pool for NCCL",
            "export XLA_PYTHON_CLIENT_MEM_FRACTION=.85",
            "bash",
        ),
    )
    references = (
        (
            "NCCL: environment variables",
            "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html",
        ),
        (
            "PyTorch: distributed communication package",
            "https://pytorch.org/docs/stable/distributed.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is not None:
            found = self._from_failure(facts, fail)
            if found is not None:
                return found
        return None if facts.is_text_only else self._outside_growth(facts, fail is not None)

    def _from_failure(self, facts: Facts, fail: Failure) -> Finding | None:
        involved = facts.frameworks(fail.oom)
        if fail.oom.library == "nccl":
            summary = "NCCL could not allocate its communication buffers."
            evidence = (
                [bytes_evidence("NCCL asked for", fail.oom.requested_bytes)]
                if fail.oom.requested_bytes
                else []
            )
            return self.finding(facts, Signals(STRONG), summary, evidence, frameworks=involved)
        in_collective = fail.stack_cues.collective
        if in_collective:
            summary = (
                "The error was raised inside a collective operation, where NCCL allocates "
                "its buffers."
            )
            return self.finding(
                facts,
                Signals(LIKELY),
                summary,
                [],
                to_confirm="rerun with NCCL_DEBUG=INFO to see NCCL's allocations",
                frameworks=involved,
            )
        return None

    def _outside_growth(self, facts: Facts, had_failure: bool) -> Finding | None:
        """Our processes' device memory outside the framework pools grew by buffer sizes."""
        distributed = (facts.trace.header.world_size or 0) > 1 or any(
            k.startswith("NCCL_") for k in facts.trace.header.env
        )
        if not distributed:
            return None
        for pid in facts.trace.our_pids():
            for series in facts.trace.series_keys():
                if (
                    series.metric != Metric.GPU_PROC_USED
                    or series.pid != pid
                    or series.device is None
                ):
                    continue
                growth = _outside_pool_growth(facts, series.device, pid)
                if growth is not None and growth >= OUTSIDE_GROWTH_BYTES:
                    summary = (
                        f"Memory outside the framework's pool grew by {format_bytes(growth)} in a "
                        "distributed run: the size of NCCL's buffers."
                    )
                    evidence = [bytes_evidence("growth outside the framework pool", growth)]
                    return self.finding(
                        facts,
                        Signals.of(POSSIBLE, ended_in_failure=had_failure),
                        summary,
                        evidence,
                        frameworks=facts.frameworks(),
                    )
        return None


def _outside_pool_growth(facts: Facts, device: int, pid: int) -> float | None:
    used = facts.trace.series(Metric.GPU_PROC_USED, device, pid)
    pools = [
        s
        for framework in ("pytorch", "tensorflow", "jax")
        if (s := facts.trace.series(framework_metric(framework, Metric.RESERVED), device, pid))
        is not None
    ]
    if used is None or not pools or len(used) < 2:
        return None
    outside = [
        value - sum(p.at(t) or 0.0 for p in pools)
        for t, value in zip(used.times, used.values, strict=True)
    ]
    return max(outside) - outside[0]


RULE = NcclBuffers()
