"""XLA OOM errors (JAX, TPU runtimes): RESOURCE_EXHAUSTED forms, BufferAssignment, HBM reports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memdoc.kinds import OomKind
from memdoc.oom.context import guess_framework
from memdoc.oom.fields import INT, SIZE, first_group, first_known, is_huge, loose, to_bytes, to_int
from memdoc.oom.logtext import Hit, LogText, Window, rank_of
from memdoc.oom.patterns import compile_later
from memdoc.trace.model import OomInfo

_NEEDLES = (
    "out of memory while trying to allocate",
    "out of memory allocating",
    "failed to allocate request for",
    "that was not possible",
    "ran out of memory in memory space",
)
# Older XLA clients' "Resource exhausted: Out of memory while trying to allocate N bytes."
# as logs wrap it: "Out" ends one line and "of memory" starts the next.
_SPLIT_HEAD = "resource exhausted: out"
_SPLIT_TAIL = "of memory while trying to allocate"
# The request, most exact wording first ("(6727663616B)" beats "6.27GiB").
_REQUESTS = (
    loose(rf"Out of memory while trying to allocate ({INT}) bytes"),
    loose(rf"Out of memory while trying to allocate ({SIZE})"),
    loose(rf"Out of memory allocating ({INT}) bytes"),
    loose(rf"Failed to allocate request for {SIZE} \(({INT}) ?B\)"),
    loose(rf"Failed to allocate request for ({SIZE})"),
    loose(rf"Attempting to (?:allocate|reserve) ({SIZE})"),
)
_ORDINAL = loose(r"device ordinal (\d{1,4})")
_FREE = loose(rf"There are ({SIZE}) free")
_HBM_USED = loose(rf"Used ({SIZE}) of ({SIZE}) \w{{1,20}}")
_HBM_CAPACITY = loose(rf"HBM capacity ({SIZE})")
_TEMP = (loose(rf"preallocated temp allocation: ({SIZE})"), loose(rf"HLO temp ({SIZE})"))
_TOTAL_ALLOCATION = loose(rf"total allocation: ({SIZE})")
_PARAMETERS = loose(rf"parameter allocation: ({SIZE})")
_OUTPUTS = loose(rf"maybe_live_out allocation: ({SIZE})")
_SOURCE = compile_later(r'source_file="([^"]{1,500})" source_line=(\d{1,9})')
_XLA_SHAPE = compile_later(r"^([a-z]{1,4}\d{0,3})\[([\d,]{0,200})\]")
_SIZE_LINE = compile_later(rf"^(?:\d{{1,3}}\.\s{{0,3}})?Size: ({SIZE})", re.IGNORECASE)
_LABEL_LINE = compile_later(r"^XLA Label: (\S{1,100})")
_SHAPE_LINE = compile_later(r"^(?:Shape|Entry Parameter Subshape): (\S{1,300})")
_KIND_LINE = compile_later(r"^Allocation type: (.{1,60})$")
_OP_NAME = compile_later(r'op_name="([^"]{1,400})"')
_PROGRAM = compile_later(r"^((?:p?jit|pmap|xmap|shard_map)\([\w.<>-]{1,200}\))")
_MODULE = compile_later(r"HloModule ([\w.-]{1,200})|module (jit_[\w.-]{1,200})")
_COMPILE_CUES = (
    "bufferassignment",
    "program hbm requirement",
    "ran out of memory in memory space",
    "by rematerialization",
)
_REMAT_NEEDLE = "can't reduce memory use below"
_REMAT_WARNING = loose(
    rf"Can't reduce memory use below (-?{SIZE})[^;]{{0,80}} by rematerialization; "
    rf"only reduced to ({SIZE})(?: \((\d{{1,25}}) bytes\))?"
)
_TPU_CUES = ("hbm", "tpu", "bottom of memory")
_GPU_CUES = ("gpu", "cuda", "rocm", "device ordinal", "_bfc")
# Wordings only XLA's GPU/CPU clients use; with no other cue they point to JAX.
_JAX_WORDINGS = ("out of memory while trying", "out of memory allocating", "allocate request for")
MAX_BUFFERS = 20
# How far below a buffer's `Size:` line its `XLA Label:` line may come.
BUFFER_LINES = 4


@dataclass
class _Buffer:
    size: int
    label: str | None = None
    shape: str | None = None
    op: str | None = None
    source: str | None = None  # "file:line" of the op that made it

    def describe(self) -> str:
        text = " ".join(part for part in (self.label, self.shape) if part) or "buffer"
        return f"{text} ({self.op[:160]})" if self.op else text


def find(log: LogText) -> list[Hit]:
    """Every XLA RESOURCE_EXHAUSTED error, with its buffer report."""
    anchors: dict[int, int] = {}
    for needle in _NEEDLES:
        for line, column in log.anchors(needle):
            anchors.setdefault(line, column)
    for line, column in log.anchors(_SPLIT_HEAD):
        if log.lower_head(line + 1).lstrip().startswith(_SPLIT_TAIL):
            anchors.setdefault(line, column)
    if not anchors:
        anchors.update(_peak_buffer_listing(log) or _remat_warning(log))
    hits = []
    for line in sorted(anchors):
        window = log.window(
            line, anchors[line], max_lines=800, max_chars=20000, stop_at=_NEEDLES, blank_lines=2
        )
        hits.append(_hit(log, line, window))
    return hits


def _peak_buffer_listing(log: LogText) -> dict[int, int]:
    """XLA's list of peak buffers, which it prints only when an allocation fails, pasted
    without the error line above it: anchored at its first `Size:` line that an `XLA Label:`
    line follows."""
    for line, _ in log.anchors("xla label:"):
        for back in range(1, BUFFER_LINES + 1):
            if _SIZE_LINE.match(log.head(line - back, 200).strip()):
                return {line - back: 0}
    return {}


def _remat_warning(log: LogText) -> dict[int, int]:
    """XLA's warning that the compiled program's plan stays above the memory it may use, even
    after rematerialization (it prints it only then), pasted without the error that follows."""
    for line, column in log.anchors(_REMAT_NEEDLE):
        if _REMAT_WARNING.search(log.head(line, 2000)):
            return {line: column}
    return {}


def _remat_peak(text: str) -> int | None:
    """The program's planned peak after rematerialization, exact bytes where XLA gave them."""
    found = _REMAT_WARNING.search(text)
    if found is None:
        return None
    return first_known(to_int(found.group(3)), to_bytes(found.group(2)))


def _hit(log: LogText, line: int, window: Window) -> Hit:
    text = window.joined
    lowered = text[:20000].lower()
    requested = None
    for pattern in _REQUESTS:
        requested = to_bytes(first_group(pattern.search(text)))
        if requested is not None:
            break
    buffers = _buffers(window)
    hbm = _HBM_USED.search(text)
    capacity = to_bytes(first_group(_HBM_CAPACITY.search(text)))
    total = first_known(to_bytes(first_group(hbm, 2)), capacity)
    temp = None
    for pattern in _TEMP:
        if temp is None:
            temp = to_bytes(first_group(pattern.search(text)))
    start = line
    if "resource exhausted" not in lowered and "resource exhausted" in log.lower_head(line - 1):
        start = line - 1  # "Resource exhausted: From /job:tpu_worker/...:" heads the message
    info = OomInfo(
        framework=_framework(log, line, window, lowered),
        kind=OomKind.COMPILE if any(cue in lowered for cue in _COMPILE_CUES) else OomKind.ALLOCATOR,
        message=window.message(min(len(window.parts), 12)),
        device=to_int(first_group(_ORDINAL.search(text))),
        device_type=_device_type(lowered),
        requested_bytes=requested,
        requested_unknown_huge=is_huge(requested),
        total_bytes=total,
        free_bytes=to_bytes(first_group(_FREE.search(text))),
        xla_program=_program(window, buffers),
        xla_buffers=tuple((b.describe(), b.size) for b in buffers),
        xla_temp_bytes=temp,
        xla_total_bytes=first_known(
            to_bytes(first_group(_TOTAL_ALLOCATION.search(text))),
            _remat_peak(text),
        ),
        xla_parameter_bytes=to_bytes(first_group(_PARAMETERS.search(text))),
        xla_output_bytes=to_bytes(first_group(_OUTPUTS.search(text))),
        rank=rank_of(log.lines[line][:200]),
        **_largest_buffer(buffers),
    )
    return Hit(
        line=start,
        end=window.last_line,
        info=info,
        rank=info.rank,
        key=(requested,) if requested is not None else (),
    )


def _framework(log: LogText, line: int, window: Window, lowered: str) -> str:
    guessed = guess_framework(log, line, window)
    if guessed is not None:
        return guessed
    if any(wording in lowered for wording in _JAX_WORDINGS):
        return "jax"
    return "unknown"


def _device_type(lowered: str) -> str | None:
    if any(cue in lowered for cue in _TPU_CUES):
        return "tpu"
    if any(cue in lowered for cue in _GPU_CUES):
        return "gpu"
    return None


def _buffers(window: Window) -> list[_Buffer]:
    """Peak buffers (GPU) or largest program allocations (TPU), largest first."""
    buffers: list[_Buffer] = []
    for raw in window.parts:
        part = raw.strip()
        size_match = _SIZE_LINE.match(part)
        if size_match is not None:
            size = to_bytes(size_match.group(1))
            if size is not None:
                buffers.append(_Buffer(size=size))
            continue
        if not buffers:
            continue
        current = buffers[-1]
        label = first_group(_LABEL_LINE.match(part)) or first_group(_KIND_LINE.match(part))
        if label and current.label is None:
            current.label = label
        shape = first_group(_SHAPE_LINE.match(part))
        if shape and current.shape is None:
            current.shape = shape
        op = first_group(_OP_NAME.search(part))
        if op and current.op is None:
            current.op = op
        source = _SOURCE.search(part)
        if source is not None and current.source is None:
            current.source = f"{source.group(1)}:{source.group(2)}"
    buffers.sort(key=lambda b: b.size, reverse=True)
    return buffers[:MAX_BUFFERS]


def _largest_buffer(buffers: list[_Buffer]) -> dict[str, Any]:
    """The op, shape, dtype and source line of the largest buffer, where the text says."""
    if not buffers:
        return {}
    largest = buffers[0]
    out: dict[str, Any] = {"op": largest.op or largest.label, "source": largest.source}
    shape = _XLA_SHAPE.match(largest.shape or "")
    if shape is not None:
        out["dtype"] = shape.group(1)
        out["shape"] = tuple(int(d) for d in shape.group(2).split(",") if d)
    return out


def _program(window: Window, buffers: list[_Buffer]) -> str | None:
    """The jitted program: `jit(train_step)` from the op names, else the HLO module name."""
    for buffer in buffers:
        if buffer.op:
            found = first_group(_PROGRAM.match(buffer.op))
            if found:
                return found
    module = window.search(_MODULE)
    if module is not None:
        return module.group(1) or module.group(2)
    return None
