"""PyTorch allocator OOM messages of every era (0.x THC to 2.x), MPS/XPU/HIP, host allocator."""

from __future__ import annotations

import re
from dataclasses import replace

from memdoc.kinds import OomKind
from memdoc.oom.context import framework_in
from memdoc.oom.fields import (
    INT,
    SIZE,
    first_group,
    first_known,
    is_huge,
    loose,
    to_bytes,
    to_int,
)
from memdoc.oom.logtext import (
    Hit,
    LogText,
    Window,
    is_source_line,
    message_part,
    rank_of,
    strip_prefix,
)
from memdoc.oom.patterns import Pattern, compile_later
from memdoc.trace.model import OomInfo, ProcessUsage

# ComfyUI's log line for a torch.OutOfMemoryError whose message is "Allocation on device".
_COMFYUI = "exception during processing !!! allocation on device"
# Lowercase needles that start a PyTorch allocator message.
_ALLOCATOR_NEEDLES = (
    "cuda out of memory",
    "hip out of memory",
    "xpu out of memory",
    "torch.outofmemoryerror",
    "torch.cuda.outofmemoryerror",
    "outofmemoryerror ",  # IPython's traceback header: the class, padded, then "Traceback"
    "mps backend out of memory",
    "cuda runtime error (2)",
    "cuda runtime err(2)",
    "error=2 : out of memory",
    _COMFYUI,
)
_CPU_NEEDLE = "defaultcpuallocator"

# The class name without a message counts only as the exception line that names it
# (followed by its message, or alone on its line; not named in a sentence), or as the header
# of IPython's traceback, which names the class before the frames.
_EXCEPTION = compile_later(
    r"^(?:torch\.)?(?:cuda\.)?OutOfMemoryError"
    r"(?::\s*\S|\s*$|\s{2,}Traceback \(most recent call last\))"
)

_REQUESTED = loose(rf"(?:tried|trying) to allocate (more than )?({SIZE})")
# 1.0-2.0: "(GPU 0; 11.17 GiB total capacity; 10.90 GiB already allocated; ...)".
_GPU_OLD = loose(r"\(GPU (\d{1,4}) ;")
_TOTAL_OLD = loose(rf"({SIZE}) total capacity")
_ALLOCATED_OLD = loose(rf"({SIZE}) already allocated")
_FREE_OLD = loose(rf"({SIZE}) free [;)]")
_ALLOWED = loose(rf"({SIZE}) allowed")
_RESERVED_OLD = loose(rf"({SIZE}) reserved in total by PyTorch")
# Before 1.5 "cached" was the pool's free part (allocated can exceed it).
_CACHED_OLD = loose(rf"({SIZE}) cached \)")
# 2.1+: "GPU 0 has a total capacity of 15.58 GiB of which 71.25 MiB is free." (2.1: "capacty")
_TOTAL_NEW = loose(rf"(?:GPU|XPU|device) (\d{{1,4}}) has a total capaci?ty of ({SIZE})")
_FREE_NEW = loose(rf"of which ({SIZE}) is free")
_PROCESS = loose(rf"Process ({INT}) has ({SIZE}) memory in use")
_THIS_PROCESS = loose(rf"this process has ({SIZE}) memory in use")
_ALLOCATED_NEW = loose(rf"Of the allocated memory ({SIZE}) is allocated by PyTorch")
_PRIVATE = loose(rf"with ({SIZE}) allocated in private pools")
_UNALLOCATED = loose(rf"({SIZE}) is reserved by PyTorch but unallocated")
_HINT_START = loose(
    r"If reserved (?:but unallocated )?memory is|Please use `empty_cache`"
    r"|Use PYTORCH_MPS_HIGH_WATERMARK_RATIO"
)
_HINT_END = loose(
    r"environment-variables\)|PYTORCH_CUDA_ALLOC_CONF(?! =)\.?|cached memory\.|system failure\)\.?"
)
_MPS = loose(
    rf"MPS backend out of memory \(MPS allocated: ({SIZE}) , other allocations: ({SIZE}) ,"
    rf" max allowed: ({SIZE}) \)"
)
_CPU_REQUEST = loose(rf"you tried to allocate ({INT}) bytes")
# The message's closing figures, which only PyTorch's allocator prints.
_TAIL_NEEDLES = (
    ("reserved in total by pytorch", _RESERVED_OLD),
    ("is reserved by pytorch but unallocated", _UNALLOCATED),
    ("has a total capac", _TOTAL_NEW),
)
_END_MARKERS = (_HINT_END, _UNALLOCATED, _RESERVED_OLD, _CACHED_OLD, _REQUESTED)


def find(log: LogText) -> list[Hit]:
    """Every PyTorch allocator (and DefaultCPUAllocator) OOM in the log."""
    anchors: dict[int, int] = {}
    for needle in _ALLOCATOR_NEEDLES:
        for line, column in log.anchors(needle):
            anchors.setdefault(line, column)
    tail_only = not anchors
    if tail_only:
        anchors.update(_message_tail(log))
    hits: list[Hit] = []
    for line in sorted(anchors):
        window = log.window(line, anchors[line], max_chars=3000, stop_at=_ALLOCATOR_NEEDLES)
        first = strip_prefix(message_part(window.parts[0], anchors[line]))
        if is_source_line(first) or not (tail_only or _is_error_line(first)):
            continue
        hits.append(_allocator_hit(log, line, window))
    for line, column in log.anchors(_CPU_NEEDLE):
        window = log.window(line, column, max_lines=3)
        if not is_source_line(window.parts[0]):
            hits.append(_cpu_hit(log, line, window))
    return hits


def _message_tail(log: LogText) -> dict[int, int]:
    """The allocator message's own closing figures pasted without its first words (a comment
    quoting "4.77 GiB allowed; 4.74 GiB reserved in total by PyTorch"): only PyTorch's
    message says these, so they stand for it."""
    for needle, figure in _TAIL_NEEDLES:
        for line, _ in log.anchors(needle):
            if figure.search(log.head(line, 2000)):
                return {line: 0}
    return {}


def _is_error_line(first: str) -> bool:
    """A message line, or the exception line naming the class (not `except X:` in source)."""
    lowered = first.lower()
    return "out of memory" in lowered or _COMFYUI in lowered or _EXCEPTION.match(first) is not None


def _size(pattern: Pattern, text: str, group: int = 1) -> int | None:
    return to_bytes(first_group(pattern.search(text), group))


def _allocator_hit(log: LogText, line: int, window: Window) -> Hit:
    text = window.joined
    requested_match = _REQUESTED.search(text)
    requested = to_bytes(first_group(requested_match, 2))
    more_than = requested_match is not None and requested_match.group(1) is not None
    device = to_int(first_group(_TOTAL_NEW.search(text)) or first_group(_GPU_OLD.search(text)))
    total = first_known(_size(_TOTAL_NEW, text, 2), _size(_TOTAL_OLD, text))
    free = first_known(_size(_FREE_NEW, text), _size(_FREE_OLD, text))
    allocated, reserved, unallocated = _pool(text)
    processes, this_process = _processes(text)
    # THC's words are Torch7's as well as early PyTorch's.
    torch7 = framework_in(text[:4000].lower()) == "torch7"
    info = OomInfo(
        framework="torch7" if torch7 else "pytorch",
        kind=OomKind.ALLOCATOR,
        message=_message(window),
        device=device,
        device_type="gpu",
        requested_bytes=requested,
        requested_unknown_huge=more_than or is_huge(requested),
        total_bytes=total,
        free_bytes=free,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        reserved_unallocated_bytes=unallocated,
        private_pool_bytes=_size(_PRIVATE, text),
        this_process_bytes=this_process,
        limit_bytes=_size(_ALLOWED, text),
        processes=processes,
        hint=_hint(text),
        rank=rank_of(log.lines[line][:200]),
    )
    mps = _MPS.search(text)
    if mps is not None:
        info = _with_mps(info, mps)
    return Hit(
        line=line,
        end=window.last_line,
        info=info,
        rank=info.rank,
        key=(requested, device) if requested is not None else (),
    )


def _pool(text: str) -> tuple[int | None, int | None, int | None]:
    """(allocated, reserved, reserved but unallocated), each derived where the era implies it."""
    allocated = _size(_ALLOCATED_NEW, text)
    if allocated is not None:
        # 2.1+: "allocated by PyTorch" includes private pools; reserved = that + unallocated.
        unallocated = _size(_UNALLOCATED, text)
        reserved = allocated + unallocated if unallocated is not None else None
        return allocated, reserved, unallocated
    allocated = _size(_ALLOCATED_OLD, text)
    reserved = _size(_RESERVED_OLD, text)
    if reserved is not None:
        # Both are rounded to two decimals, so the difference can dip just below zero.
        unallocated = max(0, reserved - allocated) if allocated is not None else None
        return allocated, reserved, unallocated
    cached = _size(_CACHED_OLD, text)
    if cached is not None and allocated is not None:
        return allocated, allocated + cached, cached
    return allocated, None, cached


def _processes(text: str) -> tuple[tuple[ProcessUsage, ...], int | None]:
    """One entry per "Process N has X" / "this process has X", in order of appearance."""
    found: list[tuple[int, ProcessUsage]] = []
    for match in _PROCESS.finditer(text):
        usage = ProcessUsage(pid=to_int(match.group(1)), used_bytes=to_bytes(match.group(2)))
        found.append((match.start(), usage))
    this_process: int | None = None
    for match in _THIS_PROCESS.finditer(text):
        this_process = to_bytes(match.group(1))
        found.append((match.start(), ProcessUsage(None, this_process, this_process=True)))
    found.sort(key=lambda item: item[0])
    return tuple(usage for _, usage in found), this_process


def _hint(text: str) -> str | None:
    start = _HINT_START.search(text)
    if start is None:
        return None
    end = _HINT_END.search(text, start.start())
    stop = end.end() if end is not None else min(len(text), start.start() + 400)
    return " ".join(text[start.start() : stop].split())


def _message(window: Window) -> str:
    """The message up to its last known field, so unrelated following lines stay out."""
    text = window.joined
    end = 0
    for pattern in _END_MARKERS:
        for match in pattern.finditer(text):
            end = max(end, match.end())
    return window.message(window.parts_to(end) if end else 1)


def _with_mps(info: OomInfo, match: re.Match[str]) -> OomInfo:
    return replace(
        info,
        allocated_bytes=to_bytes(match.group(1)),
        limit_bytes=to_bytes(match.group(3)),
        allocator="mps",
    )


def _cpu_hit(log: LogText, line: int, window: Window) -> Hit:
    requested = to_int(first_group(_CPU_REQUEST.search(window.joined)))
    info = OomInfo(
        framework="pytorch",
        kind=OomKind.HOST_ALLOC,
        message=window.message(1),
        device_type="cpu",
        requested_bytes=requested,
        requested_unknown_huge=is_huge(requested),
        rank=rank_of(log.lines[line][:200]),
    )
    return Hit(line=line, end=line, info=info, rank=info.rank, key=(requested,))
