"""BFC allocator dumps (TensorFlow, and XLA under JAX) printed at an OOM: stats, bins, chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

from memdoc.kinds import OomKind
from memdoc.oom.fields import NUM, device_from_allocator, first_group, to_bytes
from memdoc.oom.logtext import Hit, LogText, rank_of, strip_prefix
from memdoc.oom.patterns import compile_later
from memdoc.oom.tensorflow import bfc_framework
from memdoc.trace.model import OomInfo

# How far past its `InUse:` line a Stats block may run (it has eight lines).
STATS_AFTER_ANCHOR = 12
_STATS_NEEDLE = "inuse:"  # `InUse:` and `MaxInUse:` lines of the Stats block
# A number with an optional unit, never swallowing the next word ("1074790400 memory_limit_").
_AMOUNT = rf"{NUM}(?:\s{{0,3}}(?:[KMGTPE]i?B|bytes?|B)(?!\w))?"
_STAT = compile_later(
    r"^(Limit|InUse|MaxInUse|NumAllocs|MaxAllocSize|Reserved|PeakReserved|LargestFreeBlock):"
    rf"\s{{0,40}}({_AMOUNT})\s*$"
)
_BIN = compile_later(
    rf"Bin \((\d{{1,20}})\):\s{{0,10}}Total Chunks: (\d{{1,20}}), Chunks in use: (\d{{1,20}})\."
    rf" ({_AMOUNT}) allocated for chunks\. ({_AMOUNT}) in use in bin"
)
_CHUNK = compile_later(
    r"\b(InUse|Free|Chunk) {1,3}at [0-9a-fA-Fx]{1,20}(?: next -?\d{1,20})? of size (\d{1,20})"
)
_POOL = compile_later(
    rf"(?:total_region_allocated_bytes_|Total bytes in pool|Total size in pool):? ({_AMOUNT})"
)
_MEMORY_LIMIT = compile_later(rf"memory_limit_: ({_AMOUNT})")
_IN_USE_SUM = compile_later(rf"Sum Total of in-use chunks: ({_AMOUNT})")
_DUMP_FOR = compile_later(r"BFCAllocator dump for ([\w.-]{1,100})")
_BIN_FOR = compile_later(rf"Bin for ({_AMOUNT}) was")
# Old dumps list every chunk; a bound keeps a corrupt log from scanning forever.
MAX_DUMP_LINES = 500_000


@dataclass
class _Dump:
    """What the lines of one dump say, gathered while walking back from its Stats block."""

    stats: dict[str, int] = field(default_factory=dict)
    bins: list[tuple[int, int, int]] = field(default_factory=list)
    largest_free: int | None = None
    pool: int | None = None
    memory_limit: int | None = None
    in_use_sum: int | None = None
    allocator: str | None = None
    bin_for: int | None = None


def find(log: LogText) -> list[Hit]:
    """One prelude hit per BFC dump (its Stats block is the anchor)."""
    hits: list[Hit] = []
    covered = -1
    for line, _ in log.anchors(_STATS_NEEDLE):
        if line <= covered:
            continue  # the MaxInUse line of a block already read
        if not strip_prefix(log.head(line, 100)).startswith(("InUse:", "MaxInUse:")):
            continue
        hit = _dump_hit(log, line)
        if hit is not None:
            hits.append(hit)
            covered = hit.end
    return hits


def _dump_hit(log: LogText, anchor: int) -> Hit | None:
    header: int | None = None
    for back in range(1, 7):
        if "stats:" in log.lower_head(anchor - back):
            header = anchor - back
            break
    dump = _Dump()
    # Without a `Stats:` line, read from where Limit would be (two lines above MaxInUse).
    begin = header + 1 if header is not None else max(0, anchor - 2)
    first, end = _read_stats(log, begin, anchor + STATS_AFTER_ANCHOR, dump)
    if "InUse" not in dump.stats and "Limit" not in dump.stats:
        return None
    # The chunk listing and pool lines come before the `Stats:` line they belong to.
    start = _read_region(log, header, dump) if header is not None else first
    return Hit(
        line=start,
        end=end,
        info=_info(log, start, dump),
        role="prelude",
        soft=True,
        rank=rank_of(log.head(start, 200)),
    )


def _read_stats(log: LogText, begin: int, last: int, dump: _Dump) -> tuple[int, int]:
    """Parse `Limit: ...` to `LargestFreeBlock: ...` from line `begin` up to line `last`:
    (first, last) line read."""
    first: int | None = None
    end = begin
    for index in range(begin, min(len(log.lines), last + 1)):
        part = strip_prefix(log.head(index, 300))
        match = _STAT.match(part)
        if match is not None and match.group(1) in dump.stats:
            break  # a second Stats block starts: it is a dump of its own
        if match is not None:
            value = to_bytes(match.group(2))
            if value is not None:
                dump.stats[match.group(1)] = value
                first = index if first is None else first
            end = index
        elif part and dump.stats:
            # The `****___` bar that draws the pool follows the stats.
            if "bfc_allocator" in part and ("**" in part or "__" in part):
                end = index
            break
    return (first if first is not None else begin), end


def _read_region(log: LogText, header: int, dump: _Dump) -> int:
    """Walk back over the dump's lines (bins, chunks, pool); the first line of the dump."""
    start = header
    for index in range(header - 1, max(-1, header - MAX_DUMP_LINES), -1):
        lowered = log.lower_head(index, 400)
        if "bfc_allocator" not in lowered or "ran out of memory" in lowered:
            break
        text = log.head(index, 400)
        start = index
        _read_line(text, dump)
        if "bfcallocator dump for" in lowered:
            break
    return start


def _read_line(text: str, dump: _Dump) -> None:
    chunk = _CHUNK.search(text)
    if chunk is not None:
        if chunk.group(1) == "Free":
            size = int(chunk.group(2))
            dump.largest_free = max(dump.largest_free or 0, size)
        return
    bin_match = _BIN.search(text)
    if bin_match is not None:
        total_chunks = int(bin_match.group(2))
        in_use_bytes = to_bytes(bin_match.group(5))
        if total_chunks > 0 and in_use_bytes is not None:
            size = int(bin_match.group(1))
            dump.bins.append((size, int(bin_match.group(3)), in_use_bytes))
        return
    pool = to_bytes(first_group(_POOL.search(text)))
    if pool is not None:
        dump.pool = pool
        dump.memory_limit = to_bytes(first_group(_MEMORY_LIMIT.search(text)))
        return
    in_use_sum = to_bytes(first_group(_IN_USE_SUM.search(text)))
    if in_use_sum is not None:
        dump.in_use_sum = in_use_sum
        return
    bin_for = to_bytes(first_group(_BIN_FOR.search(text)))
    if bin_for is not None:
        dump.bin_for = bin_for
        return
    dump.allocator = first_group(_DUMP_FOR.search(text)) or dump.allocator


def _info(log: LogText, start: int, dump: _Dump) -> OomInfo:
    stats = dump.stats
    in_use = stats.get("InUse", dump.in_use_sum)
    largest_free = dump.largest_free
    if largest_free is None:
        largest_free = stats.get("LargestFreeBlock")
    unallocated = None
    if dump.pool is not None and in_use is not None and dump.pool >= in_use:
        unallocated = dump.pool - in_use
    device, device_type = device_from_allocator(dump.allocator)
    return OomInfo(
        framework=bfc_framework(log, start),
        kind=OomKind.ALLOCATOR,
        message=f"BFC allocator dump{f' for {dump.allocator}' if dump.allocator else ''}",
        device=device,
        device_type=device_type,
        requested_bytes=dump.bin_for,
        allocated_bytes=in_use,
        reserved_bytes=dump.pool,
        reserved_unallocated_bytes=unallocated,
        allocator=dump.allocator,
        bfc_in_use_bytes=in_use,
        bfc_limit_bytes=stats.get("Limit", dump.memory_limit),
        bfc_max_in_use_bytes=stats.get("MaxInUse"),
        bfc_largest_free_block_bytes=largest_free,
        bfc_num_allocs=stats.get("NumAllocs"),
        bfc_bins=tuple(sorted(dump.bins)),
    )
