"""Read PyTorch CUDA memory snapshots of every format era into typed, immutable records."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from memdoc.errors import InputError
from memdoc.importers.safe_pickle import load_plain_pickle

# Block states. The snapshot code writes "active_pending_free"; its docstring says
# "active_awaiting_free": both mean freed by the program, still in use by a stream.
ALLOCATED = "active_allocated"
INACTIVE = "inactive"
PENDING_FREE_STATES = frozenset({"active_pending_free", "active_awaiting_free"})
DEFAULT_POOL = (0, 0)


class Frame(NamedTuple):
    """One frame of a recorded stack."""

    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.name}"


Stack = tuple[Frame, ...]  # innermost frame first, as PyTorch records them


class Block(NamedTuple):
    """A piece of a segment: a live allocation, or cached memory."""

    address: int
    size_bytes: int
    requested_bytes: int
    state: str
    frames: Stack

    @property
    def allocated(self) -> bool:
        return self.state == ALLOCATED

    @property
    def free(self) -> bool:
        return self.state == INACTIVE


class Segment(NamedTuple):
    """Memory the allocator got from CUDA (one cudaMalloc, or one expandable mapping)."""

    device: int
    address: int
    total_bytes: int
    stream: int
    segment_type: str  # "large" or "small"
    pool_id: tuple[int, int]  # (0, 0) is the default pool; others are private (CUDA graphs)
    is_expandable: bool
    blocks: tuple[Block, ...]

    @property
    def allocated_bytes(self) -> int:
        return sum(b.size_bytes for b in self.blocks if b.allocated)

    @property
    def free_bytes(self) -> int:
        return sum(b.size_bytes for b in self.blocks if b.free)


class TraceEntry(NamedTuple):
    """One allocator action from the history ring buffer."""

    action: str  # alloc, free_requested, free_completed, segment_alloc, segment_free, ...
    address: int | None  # absent on "oom"
    size_bytes: int
    stream: int
    time_us: int | None
    frames: Stack
    device_free_bytes: int | None  # only on "oom": what CUDA still reported free


@dataclass(frozen=True)
class Snapshot:
    """A parsed `torch.cuda.memory._snapshot()`: segments, per-device traces, settings."""

    segments: tuple[Segment, ...]
    traces: Mapping[int, tuple[TraceEntry, ...]]
    era: str  # "history" (PyTorch 2.0 blocks with `history`) or "frames" (2.1 and later)
    allocator_settings: Mapping[str, Any] = field(default_factory=dict)
    annotations: tuple[Mapping[str, Any], ...] = ()
    source: Path | None = None

    def devices(self) -> list[int]:
        """Devices with segments or trace entries, in order."""
        found = {s.device for s in self.segments}
        found.update(d for d, entries in self.traces.items() if entries)
        return sorted(found)

    def segments_on(self, device: int) -> list[Segment]:
        return [s for s in self.segments if s.device == device]

    def trace_on(self, device: int) -> tuple[TraceEntry, ...]:
        return self.traces.get(device, ())

    def ooms(self, device: int) -> list[TraceEntry]:
        return [e for e in self.trace_on(device) if e.action == "oom"]

    @property
    def expandable_segments(self) -> bool | None:
        """Whether expandable segments were on: from the settings, else from the segments."""
        setting = self.allocator_settings.get("expandable_segments")
        if isinstance(setting, bool):
            return setting
        if any(s.is_expandable for s in self.segments):
            return True
        return None if self.era == "history" else False


class NotASnapshot(InputError):
    """A plain-data pickle that is not a PyTorch memory snapshot."""


def read_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Load and parse a snapshot pickle safely (nothing in it can run).

    Raises:
        RefusedPickle: the pickle would run code, is damaged, or is too large.
        NotASnapshot: the pickle holds something else.
    """
    path = Path(path)
    data = load_plain_pickle(path)
    budget = max(1, path.stat().st_size)
    try:
        return parse_snapshot(data, source=path, budget=budget, consume=True)
    except NotASnapshot as exc:
        raise NotASnapshot(f"{path}: {exc.message}") from None


def parse_snapshot(
    data: Any, *, source: Path | None = None, budget: int | None = None, consume: bool = False
) -> Snapshot:
    """Turn a snapshot dict into records. With `consume`, the dict's lists are emptied as they
    are read, so that the dict and the records never both sit in memory whole.

    `budget` bounds the blocks and entries visited (a crafted pickle can share one list many
    times over; a real snapshot never visits more of them than its file has bytes).

    Raises:
        NotASnapshot: `data` does not have the shape of a snapshot.
    """
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise NotASnapshot("not a PyTorch memory snapshot (no 'segments' list)")
    reader = _Reader(budget)
    raw_segments: list[Any] = data["segments"]
    era = "history" if _any_history(raw_segments, reader) else "frames"
    segments = tuple(reader.segment(s) for s in _items(raw_segments, consume))
    traces: dict[int, tuple[TraceEntry, ...]] = {}
    raw_traces = data.get("device_traces") or []
    if not isinstance(raw_traces, list):
        raise NotASnapshot("'device_traces' is not a list")
    for device, entries in enumerate(raw_traces):
        if not isinstance(entries, list):
            raise NotASnapshot(f"trace of device {device} is not a list")
        traces[device] = tuple(reader.entry(e) for e in _items(entries, consume))
    settings = data.get("allocator_settings")
    annotations = data.get("external_annotations")
    return Snapshot(
        segments=segments,
        traces=traces,
        era=era,
        allocator_settings=settings if isinstance(settings, dict) else {},
        annotations=tuple(a for a in annotations or () if isinstance(a, dict)),
        source=source,
    )


def _items(items: list[Any], consume: bool) -> Iterable[Any]:
    """Yield the items of a list; with `consume`, drop each from the list once read."""
    if not consume:
        yield from items
        return
    for i in range(len(items)):
        item = items[i]
        items[i] = None
        yield item


def _any_history(raw_segments: list[Any], reader: _Reader) -> bool:
    """True when the blocks carry `history` (PyTorch 2.0): the first block that says either
    way decides. Every segment and block looked at is spent from the reader's budget."""
    for segment in raw_segments:
        reader.spend()
        blocks = segment.get("blocks") if isinstance(segment, dict) else None
        for block in blocks if isinstance(blocks, list) else ():
            reader.spend()
            if isinstance(block, dict) and "history" in block:
                return True
            if isinstance(block, dict) and "frames" in block:
                return False
    return False


class _Reader:
    """Converts dicts into records, sharing one Stack per shared frames list."""

    def __init__(self, budget: int | None) -> None:
        self._budget = budget
        # Keyed by id(); the list is kept in the value so that its id cannot be reused.
        self._stacks: dict[int, tuple[Any, Stack]] = {}
        self._frames: dict[int, tuple[Any, Frame]] = {}

    def spend(self, count: int = 1) -> None:
        """Count `count` records visited, shared or not.

        Raises:
            NotASnapshot: more were visited than the budget allows.
        """
        if self._budget is not None:
            self._budget -= count
            if self._budget < 0:
                raise NotASnapshot("damaged snapshot (the same records are reused over and over)")

    def segment(self, raw: Any) -> Segment:
        self.spend()
        if not isinstance(raw, dict):
            raise NotASnapshot("a segment is not a dict")
        address = _int(raw, "address", 0)
        blocks: list[Block] = []
        raw_blocks = raw.get("blocks")
        if not isinstance(raw_blocks, list):
            raise NotASnapshot("a segment has no 'blocks' list")
        for raw_block in raw_blocks:
            block = self.block(raw_block, address)
            blocks.append(block)
            address = block.address + block.size_bytes
        pool = raw.get("segment_pool_id")
        return Segment(
            device=_int(raw, "device", 0),
            address=_int(raw, "address", 0),
            total_bytes=_int(raw, "total_size"),
            stream=_int(raw, "stream", 0),
            segment_type=str(raw.get("segment_type", "large")),
            pool_id=_pool(pool),
            is_expandable=raw.get("is_expandable") is True,
            blocks=tuple(blocks),
        )

    def block(self, raw: Any, next_address: int) -> Block:
        self.spend()
        if not isinstance(raw, dict):
            raise NotASnapshot("a block is not a dict")
        size = _int(raw, "size")
        state = str(raw.get("state", ""))
        history = raw.get("history")
        frames: Stack = ()
        requested = _int(raw, "requested_size", size)
        if isinstance(history, list):
            # PyTorch 2.0: history[0] is the block's current allocation; later entries are
            # earlier allocations that used the same memory.
            if state == ALLOCATED and history and isinstance(history[0], dict):
                frames = self.stack(history[0].get("frames"))
                requested = _int(history[0], "real_size", requested)
        else:
            frames = self.stack(raw.get("frames"))
        return Block(
            address=_int(raw, "address", next_address),
            size_bytes=size,
            requested_bytes=requested,
            state=state,
            frames=frames,
        )

    def entry(self, raw: Any) -> TraceEntry:
        self.spend()
        if not isinstance(raw, dict):
            raise NotASnapshot("a trace entry is not a dict")
        time_us = _int_or_none(raw.get("time_us"))
        return TraceEntry(
            action=str(raw.get("action", "")),
            address=_int_or_none(raw.get("addr")),
            size_bytes=_int(raw, "size", 0),
            stream=_int(raw, "stream", 0),
            time_us=time_us if time_us is not None and time_us > 0 else None,
            frames=self.stack(raw.get("frames")),
            device_free_bytes=_int_or_none(raw.get("device_free")),
        )

    def stack(self, raw: Any) -> Stack:
        if not isinstance(raw, list) or not raw:
            return ()
        cached = self._stacks.get(id(raw))
        if cached is not None:
            return cached[1]
        self.spend(len(raw))
        stack = tuple(self.frame(f) for f in raw)
        self._stacks[id(raw)] = (raw, stack)
        return stack

    def frame(self, raw: Any) -> Frame:
        cached = self._frames.get(id(raw))
        if cached is not None:
            return cached[1]
        if not isinstance(raw, dict):
            raise NotASnapshot("a stack frame is not a dict")
        frame = Frame(
            filename=str(raw.get("filename", "??")),
            line=_int_or_none(raw.get("line")) or 0,
            name=str(raw.get("name", "??")),
        )
        self._frames[id(raw)] = (raw, frame)
        return frame


def _is_int(value: Any) -> bool:
    """An integer as PyTorch writes them: 64 bits. A larger one is damage or an attack."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _int_or_none(value: Any) -> int | None:
    return value if _is_int(value) else None


def _int(raw: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if not _is_int(value):
        raise NotASnapshot(f"'{key}' is missing or not an integer")
    result: int = value
    return result


def _pool(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value):
        return (int(value[0]), int(value[1]))
    return DEFAULT_POOL
