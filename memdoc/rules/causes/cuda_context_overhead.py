"""MD003 cuda-context-overhead: many CUDA contexts on one device each cost a fixed slice."""

from __future__ import annotations

from collections.abc import Sequence

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import device_name
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    snippet,
)
from memdoc.trace.model import Metric, OomInfo
from memdoc.units import GiB, MiB, format_bytes

# What a process that only holds a context (and a little more) uses on a device.
CONTEXT_MIN_BYTES = 150 * MiB
CONTEXT_MAX_BYTES = 1536 * MiB


class CudaContextOverhead(RuleSpec):
    slug = "cuda-context-overhead"
    code = "MD003"
    title = "Many CUDA contexts share one device"
    what = """
Several processes each create a CUDA context on the same GPU. Every context costs a fixed
300 MB to 1 GB (more with all kernels loaded), before any tensor is allocated. With eight
data-parallel ranks all touching GPU 0, that GPU loses several gigabytes to contexts alone.
"""
    why = """
A context is created on the current device the first time a process uses CUDA. Code that
calls `.cuda()`, `torch.load` without `map_location`, or any CUDA function before
`torch.cuda.set_device(local_rank)` creates it on device 0. DataLoader workers or helper
processes that touch CUDA add one context each.
"""
    confirm = """
- `nvidia-smi` on the crowded GPU lists several processes of your job, most with a small,
  similar footprint (a few hundred MB).
- In a PyTorch message, several "Process N has X memory in use" lines with small X.
- `memdoc run` records per-process device memory for every rank.
"""
    fixes = (
        Fix(
            "pytorch",
            "Select the rank's device before any CUDA call",
            snippet(
                """
            import os, torch

            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            """
            ),
            gpu_only=True,
        ),
        Fix(
            "pytorch",
            "Load checkpoints onto the CPU, or onto this rank's device",
            'state = torch.load(path, map_location="cpu")',
        ),
        Fix(
            "any",
            "Load CUDA kernels lazily to shrink each context",
            "export CUDA_MODULE_LOADING=LAZY",
            "bash",
            gpu_only=True,
        ),
        Fix(
            "any",
            "Give each process only its GPU",
            "CUDA_VISIBLE_DEVICES=$LOCAL_RANK python worker.py",
            "bash",
            gpu_only=True,
        ),
    )
    references = (
        (
            "PyTorch: torch.cuda.set_device",
            "https://pytorch.org/docs/stable/generated/torch.cuda.set_device.html",
        ),
        (
            "PyTorch: torch.load map_location",
            "https://pytorch.org/docs/stable/generated/torch.load.html",
        ),
        (
            "CUDA: lazy loading",
            "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#lazy-loading",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        oom = fail.oom if fail is not None else None
        if not facts.is_text_only:
            found = self._recorded(facts, oom)
            if found is not None:
                return found
        return self._in_text(facts, oom) if oom is not None else None

    def _recorded(self, facts: Facts, oom: OomInfo | None) -> Finding | None:
        """Several of our processes on one device, most of them with a context-sized share."""
        ours = facts.trace.our_pids()
        failed = facts.failed_device(oom)
        for device in facts.trace.devices():
            footprints = [
                top[1]
                for s in facts.trace.series_for(Metric.GPU_PROC_USED, device=device.index)
                if s.key.pid in ours and (top := s.max()) is not None
            ]
            small = [b for b in footprints if CONTEXT_MIN_BYTES <= b <= CONTEXT_MAX_BYTES]
            if len(footprints) < 2 or not small:
                continue
            signals = Signals.of(
                LIKELY,
                three_or_more=len(small) >= 3,
                failed_there=oom is not None and failed == device.index,
            )
            return self._report(
                facts,
                device=device.index,
                processes=len(footprints),
                small=small,
                signals=signals,
                oom=oom,
            )
        return None

    def _in_text(self, facts: Facts, oom: OomInfo) -> Finding | None:
        small = [
            p.used_bytes
            for p in oom.processes
            if not p.this_process
            and p.used_bytes is not None
            and CONTEXT_MIN_BYTES <= p.used_bytes <= CONTEXT_MAX_BYTES
        ]
        if len(small) < 2:
            return None
        return self._report(
            facts,
            device=oom.device,
            processes=len(oom.processes),
            small=small,
            signals=Signals.of(LIKELY, three_or_more=len(small) >= 3),
            oom=oom,
        )

    def _report(
        self,
        facts: Facts,
        *,
        device: int | None,
        processes: int,
        small: Sequence[float],
        signals: Signals,
        oom: OomInfo | None,
    ) -> Finding:
        where = device_name(device)
        summary = (
            f"{len(small)} processes held only a context-sized {format_bytes(min(small))} to "
            f"{format_bytes(max(small))} each on {where}: they touch a GPU that is not theirs."
        )
        evidence = [
            count_evidence(f"processes on {where}", processes),
            count_evidence("of which context-sized", len(small)),
            bytes_evidence("held by the context-sized ones together", sum(small)),
        ]
        if sum(small) < 1 * GiB:
            signals = signals.at_most(POSSIBLE)
        return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks(oom))


RULE = CudaContextOverhead()
