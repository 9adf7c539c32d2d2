"""What an OOM's own numbers say about this process: its pool, its unused cache, its share."""

from __future__ import annotations

from memdoc.thresholds import SIGNIFICANT_SHARE
from memdoc.trace.ledger import oom_reserved_bytes, oom_this_process_bytes
from memdoc.trace.model import OomInfo

# The share of a device an unused cache must reach before an error text alone makes it a
# plausible reason: smaller caches sit beside jobs that are simply too big.
SIZEABLE_CACHE_SHARE = 0.1
# How much free memory beside a failed request means the device itself had room.
ROOM_LEFT_FACTOR = 4
ROOM_LEFT_SHARE = 0.1


def pool_bytes(oom: OomInfo) -> int | None:
    """The framework's pool (reserved, or TensorFlow's BFC region in use)."""
    reserved = oom_reserved_bytes(oom)
    return reserved if reserved is not None else oom.bfc_in_use_bytes


def held_bytes(oom: OomInfo) -> int | None:
    """Everything the error says this process held on the device."""
    own = oom_this_process_bytes(oom)
    return own if own is not None else pool_bytes(oom)


def cached_unused_bytes(oom: OomInfo) -> int | None:
    """Memory the allocator holds but has not handed out (PyTorch cache, BFC free chunks)."""
    if oom.reserved_unallocated_bytes is not None:
        return oom.reserved_unallocated_bytes
    if oom.reserved_bytes is not None and oom.allocated_bytes is not None:
        return oom.reserved_bytes - oom.allocated_bytes
    if oom.bfc_limit_bytes is not None and oom.bfc_in_use_bytes is not None:
        return oom.bfc_limit_bytes - oom.bfc_in_use_bytes
    return None


def sizeable_cache(cached_bytes: float, total_bytes: float | None) -> bool:
    """Whether an unused cache is a real share of the device (True when the size is unknown)."""
    return total_bytes is None or cached_bytes >= SIZEABLE_CACHE_SHARE * total_bytes


def significant(num_bytes: float, total_bytes: float | None) -> bool:
    """Whether an amount matters on this device (always, when the size is unknown)."""
    return total_bytes is None or num_bytes >= SIGNIFICANT_SHARE * total_bytes


def room_was_left(oom: OomInfo) -> bool:
    """The error says the device had far more free than the request (four times, and a tenth
    of the card): the device was not what refused it."""
    free, requested, total = oom.free_bytes, oom.requested_bytes, oom.total_bytes
    if free is None or not requested or not total:
        return False
    return free >= ROOM_LEFT_FACTOR * requested and free >= ROOM_LEFT_SHARE * total
