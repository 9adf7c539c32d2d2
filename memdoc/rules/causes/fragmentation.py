"""MD001 fragmentation: free memory exists in the pool, but not in one piece."""

from __future__ import annotations

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
)
from memdoc.rules.ledger import cached_unused_bytes, significant, sizeable_cache
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    ratio_evidence,
    snippet,
)
from memdoc.trace.model import Metric
from memdoc.units import format_bytes


class Fragmentation(RuleSpec):
    slug = "fragmentation"
    code = "MD001"
    title = "Free memory is cached in the pool but not in one piece"
    what = """
The framework's allocator holds memory it is not using (cached, "reserved but unallocated"),
yet a request fails because no free block is large enough. The memory exists, but it is cut
into pieces by live blocks between them.
"""
    why = """
Caching allocators (PyTorch's caching allocator, TensorFlow's BFC allocator) carve requests
out of large segments and keep freed blocks for reuse. When sizes vary from step to step, a
segment ends up with small live blocks scattered through it: it cannot be returned to the
driver, and its free parts cannot serve a large request. The allocator then frees what it
can and retries; when that fails too, you get an out-of-memory error while gigabytes show as
"reserved but unallocated".
"""
    confirm = """
- In the PyTorch message, compare "reserved by PyTorch but unallocated" (or reserved minus
  allocated in older versions) with "Tried to allocate": when the cached memory is as large
  as the request, it is fragmentation.
- `torch.cuda.memory_stats()["inactive_split_bytes.all.current"]` is large, and
  `num_alloc_retries` grows.
- A TensorFlow BFC dump shows `Limit` well above `InUse` while the largest free chunk is
  smaller than the request.
- `memdoc run` records reserved, allocated and inactive-split bytes over time.
"""
    fixes = (
        Fix(
            "pytorch",
            "Let segments grow instead of splitting (PyTorch 2.1 and later)",
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "bash",
            gpu_only=True,
        ),
        Fix(
            "pytorch",
            "Stop the allocator from splitting large blocks",
            "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512",
            "bash",
            gpu_only=True,
        ),
        Fix(
            "pytorch",
            "Release the cache at a phase change (costs speed; use sparingly)",
            snippet(
                """
            import gc, torch

            gc.collect()
            torch.cuda.empty_cache()
            """
            ),
            gpu_only=True,
        ),
        Fix(
            "tensorflow",
            "Use CUDA's stream-ordered allocator instead of BFC",
            "export TF_GPU_ALLOCATOR=cuda_malloc_async",
            "bash",
            gpu_only=True,
        ),
        Fix(
            "pytorch",
            "Keep tensor shapes constant between steps (pad to a few fixed lengths)",
            snippet(
                """
                import torch.nn.functional as F

                bucket = 128 * ((seq_len + 127) // 128)  # fixed sizes reuse the same blocks
                x = F.pad(x, (0, bucket - seq_len))
                """
            ),
        ),
    )
    references = (
        (
            "PyTorch: optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF",
            "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf",
        ),
        (
            "PyTorch: understanding CUDA memory usage",
            "https://pytorch.org/docs/stable/torch_cuda_memory.html",
        ),
        ("TensorFlow: use a GPU", "https://www.tensorflow.org/guide/gpu"),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return self._retries_without_oom(facts)
        oom = fail.oom
        requested = oom.requested_bytes
        if requested is None or requested <= 0 or oom.requested_unknown_huge:
            return None
        device = facts.failed_device(oom)
        cached = _cached_free(facts, fail, device)
        if cached is None or cached <= 0:
            return None
        free = oom.free_bytes if oom.free_bytes is not None else _device_free(facts, fail, device)
        largest = _largest_free(facts, fail, device)
        if cached >= requested:
            # From a message alone, a cache larger than the request is as common in jobs that
            # are simply too big; only a recording of the pool over time makes it likely.
            level = LIKELY
            if facts.is_text_only:
                sizeable = sizeable_cache(cached, facts.device_total(device, oom))
                level = POSSIBLE if sizeable else WEAK
            summary = (
                f"The pool held {format_bytes(cached)} it was not using, more than the "
                f"{format_bytes(requested)} requested, but not in one piece."
            )
        elif free is not None and cached + free >= requested and cached >= requested / 4:
            level = WEAK if facts.is_text_only else POSSIBLE
            summary = (
                f"Cached-but-unused {format_bytes(cached)} plus {format_bytes(free)} free on the "
                f"device would have covered the {format_bytes(requested)} request."
            )
        else:
            return None
        evidence: list[Evidence] = [
            bytes_evidence("cached in the pool but not allocated", cached),
            bytes_evidence("requested", requested),
            ratio_evidence("cached memory / request", cached / requested),
        ]
        if free is not None:
            evidence.append(bytes_evidence("free on the device", free))
        if largest is not None:
            evidence.append(bytes_evidence("largest free block in the pool", largest))
        split = _at(facts, fail, device, Metric.INACTIVE_SPLIT)
        if split is not None:
            evidence.append(bytes_evidence("inactive split blocks", split))
        signals = Signals.of(
            level,
            cache_twice_the_request=cached >= 2 * requested,
            no_block_big_enough=largest is not None and largest < requested,
            split_blocks=split is not None and split >= requested / 2,
        )
        if not significant(cached, facts.device_total(device, oom)):
            # Even in one piece this cache would not have saved a job at the limit.
            signals = signals.at_most(WEAK)
            summary += " It is a sliver of the device, though: the job was at the limit anyway."
        if _expandable_segments_on(facts, fail):
            signals = signals.at_most(POSSIBLE)
            summary += " Expandable segments were already on, so look at what keeps blocks alive."
        return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks(oom))

    def _retries_without_oom(self, facts: Facts) -> Finding | None:
        """A run that did not fail, but whose allocator had to flush its cache and retry."""
        for series in facts.series_named("torch." + Metric.ALLOC_RETRIES):
            top = series.max()
            if top is not None and top[1] >= 1:
                evidence = [count_evidence("allocation retries (cache flushed)", top[1])]
                return self.finding(
                    facts,
                    Signals(POSSIBLE),
                    "The allocator had to free its cache and retry: the pool is fragmented.",
                    evidence,
                    frameworks=["pytorch"],
                )
        return None


def _at(facts: Facts, fail: Failure, device: int | None, quantity: str) -> float | None:
    if facts.is_text_only or device is None:
        return None
    return facts.framework_at(quantity, device, fail.t)


def _cached_free(facts: Facts, fail: Failure, device: int | None) -> float | None:
    """Memory the allocator holds but does not use, from the text or the recorded series."""
    cached = cached_unused_bytes(fail.oom)
    if cached is not None:
        return cached
    reserved = _at(facts, fail, device, Metric.RESERVED)
    allocated = _at(facts, fail, device, Metric.ALLOCATED)
    if reserved is None or allocated is None:
        return None
    return reserved - allocated


def _largest_free(facts: Facts, fail: Failure, device: int | None) -> float | None:
    if fail.oom.bfc_largest_free_block_bytes:
        return fail.oom.bfc_largest_free_block_bytes
    return _at(facts, fail, device, Metric.LARGEST_FREE)


def _device_free(facts: Facts, fail: Failure, device: int | None) -> float | None:
    if facts.is_text_only or device is None:
        return None
    return facts.sum_at(Metric.GPU_FREE, device, fail.t)


def _expandable_segments_on(facts: Facts, fail: Failure) -> bool:
    conf = facts.trace.header.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:true" in conf.replace(" ", "").lower():
        return True
    return any(
        e.data.get("expandable_segments") is True for e in facts.trace.events("allocator_config")
    )


RULE = Fragmentation()
