"""What if: would expandable segments, or empty_cache(), have avoided a snapshot's OOM?"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.importers.fragmentation import OomRequest, PoolState
from memdoc.importers.torch_snapshot import Segment
from memdoc.units import MiB, format_bytes, format_percent

EXPANDABLE = "expandable_segments:True"
EMPTY_CACHE = "torch.cuda.empty_cache() before the failing call"
# The caching allocator's sizes (c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK_BYTES = 512
SMALL_SEGMENT_BYTES = 2 * MiB  # kSmallBuffer; also the page of small expandable segments
LARGE_SEGMENT_BYTES = 20 * MiB  # kLargeBuffer; also the page of large expandable segments
MIN_LARGE_ALLOC_BYTES = 10 * MiB
ROUND_LARGE_BYTES = 2 * MiB
SMALL_SIZE_BYTES = 1 * MiB


@dataclass(frozen=True)
class WhatIf:
    """One change, whether it would have avoided the OOM, and why, in sentences."""

    change: str
    avoided: bool | None  # None: the snapshot cannot tell
    available_bytes: int | None  # what the request could have drawn on with the change
    needed_bytes: int | None
    reasons: tuple[str, ...]

    @property
    def verdict(self) -> str:
        if self.avoided is None:
            return "cannot tell"
        return "would have avoided the OOM" if self.avoided else "would not have avoided it"


def round_size(requested_bytes: int) -> int:
    """The block size PyTorch carves for a request: a multiple of 512 bytes."""
    return max(MIN_BLOCK_BYTES, -(-requested_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def cuda_request_bytes(requested_bytes: int) -> int:
    """How much the allocator asks CUDA for when no cached block fits the request."""
    size = round_size(requested_bytes)
    if size <= SMALL_SIZE_BYTES:
        return SMALL_SEGMENT_BYTES
    if size < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def page_bytes(segment: Segment) -> int:
    return SMALL_SEGMENT_BYTES if segment.segment_type == "small" else LARGE_SEGMENT_BYTES


def whole_free_pages_bytes(segments: Sequence[Segment]) -> int:
    """Free bytes that fill whole pages: what expandable segments can unmap and map again."""
    total = 0
    for segment in segments:
        page = page_bytes(segment)
        for block in segment.blocks:
            if not block.free:
                continue
            start = block.address - segment.address
            first = -(-start // page) * page
            last = (start + block.size_bytes) // page * page
            total += max(0, last - first)
    return total


def releasable_bytes(segments: Sequence[Segment]) -> int:
    """What empty_cache() gives back to CUDA: segments without a live block in them (and the
    whole free pages of expandable segments)."""
    total = 0
    for segment in segments:
        if segment.is_expandable:
            total += whole_free_pages_bytes([segment])
        elif segment.blocks and all(b.free for b in segment.blocks):
            total += segment.total_bytes
    return total


def what_if(
    segments: Sequence[Segment],
    total: PoolState,
    oom: OomRequest | None,
    expandable_on: bool | None,
) -> tuple[WhatIf, ...]:
    """Both changes, judged from the segments at the snapshot and the failed request."""
    return (
        _expandable(segments, total, oom, expandable_on),
        _empty_cache(segments, total, oom),
    )


def _no_request(change: str, total: PoolState, gain_bytes: int) -> WhatIf:
    share = gain_bytes / total.reserved_bytes if total.reserved_bytes else 0.0
    percent = "under 1%" if 0 < share < 0.01 else format_percent(share)
    reasons = [
        "The snapshot records no failed request (no 'oom' entry in its trace), so whether "
        "the change would have been enough cannot be told.",
        f"At most {format_bytes(gain_bytes)} ({percent} of the "
        f"{format_bytes(total.reserved_bytes)} reserved) could have been regained by it.",
    ]
    if total.reserved_bytes and share < 0.01:
        reasons.append(
            f"Live tensors held {format_bytes(total.allocated_bytes)}: the memory was in use, "
            f"not lost to caching, so no allocator setting frees more than those "
            f"{format_bytes(gain_bytes)}; reduce what is live instead."
        )
    return WhatIf(change, None, None, None, tuple(reasons))


def _expandable(
    segments: Sequence[Segment],
    total: PoolState,
    oom: OomRequest | None,
    expandable_on: bool | None,
) -> WhatIf:
    if expandable_on:
        return WhatIf(
            EXPANDABLE,
            False,
            None,
            None,
            ("Expandable segments were already on when the snapshot was taken.",),
        )
    if oom is None or oom.device_free_bytes is None:
        return _no_request(EXPANDABLE, total, total.free_bytes)
    page = SMALL_SEGMENT_BYTES if oom.pool_kind == "small" else LARGE_SEGMENT_BYTES
    needed = -(-round_size(oom.requested_bytes) // page) * page
    likely = oom.device_free_bytes + whole_free_pages_bytes(segments)
    best = oom.device_free_bytes + total.free_bytes
    request = format_bytes(oom.requested_bytes)
    cuda_free = format_bytes(oom.device_free_bytes)
    if likely >= needed:
        reasons = (
            "With expandable segments, memory freed by tensors goes back to CUDA in whole "
            "pages and one segment per stream grows to fit a request, so free memory no longer "
            "has to be in one piece.",
            f"The free pages ({format_bytes(likely - oom.device_free_bytes)}) plus the "
            f"{cuda_free} CUDA still had make {format_bytes(likely)}, enough for the "
            f"{request} request ({format_bytes(needed)} in whole pages).",
        )
        return WhatIf(EXPANDABLE, True, likely, needed, reasons)
    if best < needed:
        reasons = (
            f"Even if all {format_bytes(total.free_bytes)} cached but free went back to CUDA, "
            f"with the {cuda_free} it still had that makes {format_bytes(best)}, short of the "
            f"{request} request.",
            f"Live tensors held {format_bytes(total.allocated_bytes)}: the memory was in use, "
            "not lost to fragmentation; reduce what is live instead.",
        )
        return WhatIf(EXPANDABLE, False, best, needed, reasons)
    reasons = (
        f"Between {format_bytes(likely)} (free memory in whole pages, plus what CUDA had) and "
        f"{format_bytes(best)} (every free byte) could have served the {request} request "
        f"({format_bytes(needed)} in whole pages).",
        "Whether it fits depends on how the live tensors would have been laid out over pages.",
    )
    return WhatIf(EXPANDABLE, None, likely, needed, reasons)


def _empty_cache(segments: Sequence[Segment], total: PoolState, oom: OomRequest | None) -> WhatIf:
    releasable = releasable_bytes(segments)
    if oom is None or oom.device_free_bytes is None:
        return _no_request(EMPTY_CACHE, total, releasable)
    needed = cuda_request_bytes(oom.requested_bytes)
    available = oom.device_free_bytes + releasable
    request = format_bytes(oom.requested_bytes)
    if releasable == 0:
        reasons = (
            f"No segment was entirely free at the OOM: the {format_bytes(total.free_bytes)} "
            "cached but free lay in segments that also held live tensors, and empty_cache() "
            "releases only whole free segments.",
            "PyTorch also releases its free segments by itself before it raises an OOM.",
        )
        return WhatIf(EMPTY_CACHE, False, available, needed, reasons)
    verdict = available >= needed
    reasons = (
        f"empty_cache() would have returned {format_bytes(releasable)} of entirely free "
        f"segments to CUDA; with the {format_bytes(oom.device_free_bytes)} CUDA had, that makes "
        f"{format_bytes(available)} for the {request} request, which needs "
        f"{format_bytes(needed)} from CUDA: {'enough' if verdict else 'not enough'}.",
        "PyTorch releases entirely free segments itself before it raises an OOM, except in "
        "private pools (CUDA graphs): free segments still there at an OOM usually belong to one.",
    )
    return WhatIf(EMPTY_CACHE, verdict, available, needed, reasons)
