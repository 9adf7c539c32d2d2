"""Replay a snapshot's allocator trace: memory over time, the peak, and what was live then."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from memdoc.importers.torch_snapshot import NotASnapshot, Snapshot, Stack, TraceEntry

# How each action moves the two totals. Allocated memory drops when the program frees a
# tensor (free_requested), as `torch.cuda.memory_allocated()` does, not when a stream lets go.
_ALLOCATED_SIGN = {"alloc": 1, "free_requested": -1}
_RESERVED_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


class Live(NamedTuple):
    """A live allocation: requested bytes and the stack that allocated it."""

    size_bytes: int
    frames: Stack


@dataclass(frozen=True)
class Replay:
    """Allocated and reserved bytes before the first entry and after each one.

    `allocated[i]` is the state after `entries[:i]`; the last value is the snapshot moment.
    Values between entries count requested sizes, anchored so that the last one equals the
    allocator's own total: they differ from `memory_allocated()` only by size rounding.
    """

    device: int
    entries: Sequence[TraceEntry]
    allocated: array[int]
    reserved: array[int]

    @property
    def peak_index(self) -> int:
        """The first index where allocated bytes were highest (the snapshot moment on ties)."""
        values = self.allocated
        best = len(values) - 1
        for i in range(len(values)):
            if values[i] > values[best]:
                best = i
        return best

    def time_us(self, index: int) -> int | None:
        """When the state at `index` began: the time of the entry that led to it."""
        if index == 0:
            return None
        return self.entries[index - 1].time_us


def allocated_bytes_at_snapshot(snapshot: Snapshot, device: int) -> int:
    """`memory_allocated()` at the snapshot moment: block sizes of live allocations."""
    return sum(b.size_bytes for s in snapshot.segments_on(device) for b in s.blocks if b.allocated)


def reserved_bytes_at_snapshot(snapshot: Snapshot, device: int) -> int:
    """`memory_reserved()` at the snapshot moment: the sizes of all segments."""
    return sum(s.total_bytes for s in snapshot.segments_on(device))


def replay(snapshot: Snapshot, device: int) -> Replay:
    """Walk the device's trace and reconstruct both totals at every step."""
    entries = snapshot.trace_on(device)
    allocated = array("q", [0]) * (len(entries) + 1)
    reserved = array("q", [0]) * (len(entries) + 1)
    try:
        for i, entry in enumerate(entries):
            allocated[i + 1] = (
                allocated[i] + _ALLOCATED_SIGN.get(entry.action, 0) * entry.size_bytes
            )
            reserved[i + 1] = reserved[i] + _RESERVED_SIGN.get(entry.action, 0) * entry.size_bytes
        _anchor(allocated, allocated_bytes_at_snapshot(snapshot, device))
        _anchor(reserved, reserved_bytes_at_snapshot(snapshot, device))
    except OverflowError:
        raise NotASnapshot("damaged snapshot (its memory totals do not fit in 64 bits)") from None
    return Replay(device=device, entries=entries, allocated=allocated, reserved=reserved)


def _anchor(values: array[int], final: int) -> None:
    # The ring buffer starts mid-run: the state before it is known only from the end.
    offset = final - values[-1]
    for i in range(len(values)):
        values[i] = max(0, values[i] + offset)


def live_at_snapshot(snapshot: Snapshot, device: int) -> dict[int, Live]:
    """Live allocations by address at the snapshot moment."""
    return {
        b.address: Live(b.requested_bytes, b.frames)
        for s in snapshot.segments_on(device)
        for b in s.blocks
        if b.allocated
    }


def live_at(snapshot: Snapshot, device: int, index: int) -> dict[int, Live]:
    """Live allocations after `entries[:index]`: back from the end to the trace's start,
    then forward to `index`. Allocations older than the trace that it saw freed carry the
    stack recorded with their free."""
    entries = snapshot.trace_on(device)
    live = live_at_snapshot(snapshot, device)
    for entry in reversed(entries):
        _undo(live, entry)
    for entry in entries[:index]:
        _apply(live, entry)
    return live


def _apply(live: dict[int, Live], entry: TraceEntry) -> None:
    if entry.address is None:
        return
    if entry.action == "alloc":
        live[entry.address] = Live(entry.size_bytes, entry.frames)
    elif entry.action == "free_requested":
        live.pop(entry.address, None)


def _undo(live: dict[int, Live], entry: TraceEntry) -> None:
    if entry.address is None:
        return
    if entry.action == "alloc":
        live.pop(entry.address, None)
    elif entry.action == "free_requested":
        live[entry.address] = Live(entry.size_bytes, entry.frames)
