"""Fragmentation of a snapshot's pools: free bytes, the largest free block, and the OOM request."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memdoc.importers.torch_snapshot import (
    DEFAULT_POOL,
    PENDING_FREE_STATES,
    Segment,
    Snapshot,
    Stack,
)
from memdoc.units import MiB

# PyTorch serves requests up to 1 MiB from the small pool, larger ones from the large pool.
SMALL_REQUEST_MAX_BYTES = 1 * MiB


@dataclass(frozen=True)
class PoolState:
    """Cached memory of one allocator pool (or of all of them): how it is split up."""

    name: str
    segments: int
    reserved_bytes: int
    allocated_bytes: int
    free_bytes: int  # cached and free for reuse (inactive blocks)
    pending_free_bytes: int  # freed by the program, still awaited by a stream
    largest_free_bytes: int
    inactive_split_bytes: int  # free blocks in segments that also hold other blocks

    @property
    def fragmentation(self) -> float | None:
        """1 - largest free block / total free (the TensorFlow profiler's measure);
        None when nothing is free."""
        if self.free_bytes <= 0:
            return None
        return 1.0 - self.largest_free_bytes / self.free_bytes


@dataclass(frozen=True)
class OomRequest:
    """The failed allocation of an `oom` trace entry."""

    requested_bytes: int
    device_free_bytes: int | None
    stream: int
    time_us: int | None
    stack: Stack

    @property
    def pool_kind(self) -> str:
        return "small" if self.requested_bytes <= SMALL_REQUEST_MAX_BYTES else "large"

    @property
    def pool_name(self) -> str:
        return f"{self.pool_kind} pool, stream {self.stream}"


@dataclass(frozen=True)
class Fragmentation:
    """Fragmentation per pool and in total, and whether the failed request would have fitted."""

    pools: tuple[PoolState, ...]
    total: PoolState
    request_pool: PoolState | None  # the pool the failed request was to come from
    fits_largest_free: bool | None  # in the largest free block of any pool
    fits_request_pool: bool | None  # in the largest free block of its own pool


def last_oom(snapshot: Snapshot, device: int) -> OomRequest | None:
    """The last failed request the device's trace recorded."""
    ooms = snapshot.ooms(device)
    if not ooms:
        return None
    entry = ooms[-1]
    return OomRequest(
        requested_bytes=entry.size_bytes,
        device_free_bytes=entry.device_free_bytes,
        stream=entry.stream,
        time_us=entry.time_us,
        stack=entry.frames,
    )


def pool_name(segment: Segment) -> str:
    name = f"{segment.segment_type} pool, stream {segment.stream}"
    if segment.pool_id != DEFAULT_POOL:
        name += f", private pool {segment.pool_id[0]}.{segment.pool_id[1]}"
    return name


def pool_state(name: str, segments: Iterable[Segment]) -> PoolState:
    """Sum up a set of segments."""
    count = reserved = allocated = free = pending = largest = split = 0
    for segment in segments:
        count += 1
        reserved += segment.total_bytes
        for block in segment.blocks:
            if block.allocated:
                allocated += block.size_bytes
            elif block.free:
                free += block.size_bytes
                largest = max(largest, block.size_bytes)
                if len(segment.blocks) > 1:
                    split += block.size_bytes
            elif block.state in PENDING_FREE_STATES:
                pending += block.size_bytes
    return PoolState(
        name=name,
        segments=count,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        free_bytes=free,
        pending_free_bytes=pending,
        largest_free_bytes=largest,
        inactive_split_bytes=split,
    )


def fragmentation_of(segments: list[Segment], oom: OomRequest | None) -> Fragmentation:
    """Per-pool and total fragmentation, and where the failed request (if any) stood."""
    groups: dict[str, list[Segment]] = {}
    for segment in segments:
        groups.setdefault(pool_name(segment), []).append(segment)
    pools = tuple(pool_state(name, members) for name, members in sorted(groups.items()))
    total = pool_state("all pools", segments)
    request_pool = None
    fits_any = fits_own = None
    if oom is not None:
        request_pool = next((p for p in pools if p.name == oom.pool_name), None)
        fits_any = total.largest_free_bytes >= oom.requested_bytes
        fits_own = request_pool is not None and (
            request_pool.largest_free_bytes >= oom.requested_bytes
        )
    return Fragmentation(
        pools=pools,
        total=total,
        request_pool=request_pool,
        fits_largest_free=fits_any,
        fits_request_pool=fits_own,
    )
