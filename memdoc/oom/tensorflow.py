"""TensorFlow OOM errors: ResourceExhaustedError (graph, eager, Keras) and BFC allocator lines."""

from __future__ import annotations

from memdoc.kinds import OomKind
from memdoc.oom.context import guess_framework
from memdoc.oom.fields import (
    INT,
    SIZE,
    device_from_allocator,
    device_from_spec,
    first_group,
    first_known,
    is_huge,
    loose,
    parse_shape,
    tensor_bytes,
    to_bytes,
    to_int,
)
from memdoc.oom.logtext import Hit, LogText, Window, rank_of
from memdoc.oom.patterns import compile_later
from memdoc.trace.model import OomInfo

# TensorFlow raises ResourceExhaustedError for allocation failures; the bare class name
# (as in "2 root error(s) found.") is one too, its details on the following lines.
_TENSOR_NEEDLES = ("oom when allocating", "failed to allocate memory", "resourceexhaustederror")
_BFC_NEEDLE = "ran out of memory trying to allocate"
# TF1's device note at start: "Total memory: 11.17GiB / Free memory: 11.10GiB" on two lines,
# or later "totalMemory: 15.90GiB freeMemory: 3.12GiB" on one.
_DEVICE_NOTE_NEEDLES = ("free memory:", "freememory:")

_SHAPE = loose(r"(?:with|of) shape ?(\[[\d ,]{0,600}\])")
_DTYPE = loose(r"\] and type (\w{1,40})")
_ALLOCATOR = loose(r"by allocator ([\w.-]{1,100})")
_NODES = (
    compile_later(r"\[\[\{\{node ([^}\s]{1,300})\}\}"),
    compile_later(r"\[\[node ([^\s(\]]{1,300})"),
    compile_later(r"\[\[Node: ([^\s=\]]{1,300})"),
    compile_later(r"\{\{function_node __wrapped__(\w{1,100}?)_device_"),
    compile_later(r"\[Op:(\w{1,200})\]"),
)
_NODE_LINE = compile_later(r"^Node: '([^']{1,300})'")
_TF_HINT = loose(r"Hint: If you want to see a list of allocated tensors.{0,300}?allocation info\.")
_TF_CUES = ("resource exhausted", "resourceexhausted", "resource_exhausted", "[op:", "{{node")

_BFC_RAN_OUT = loose(
    rf"(?:Allocator \(([\w.-]{{1,100}})\) )?ran out of memory trying to allocate ({SIZE})"
    rf"(?: \(rounded to ({INT})\))?"
)
_REQUESTED_BY = loose(r"requested by op ([\w/.:-]{1,300})")
_FRAGMENTATION_HINT = loose(r"If the cause is memory fragmentation.{0,200}?situation\.")
_TOTAL_MEMORY = loose(rf"Total ?memory: ({SIZE})")
_FREE_MEMORY = loose(rf"Free ?memory: ({SIZE})")


def find(log: LogText) -> list[Hit]:
    """Every TensorFlow OOM error, BFC 'ran out of memory' line and device memory note."""
    hits: list[Hit] = []
    seen: set[int] = set()
    for needle in _TENSOR_NEEDLES:
        for line, column in log.anchors(needle):
            if line not in seen:
                seen.add(line)
                hits.append(_tensor_hit(log, line, log.window(line, column, max_lines=8)))
    for line, column in log.anchors(_BFC_NEEDLE):
        hit = _bfc_line_hit(log, line, log.window(line, column, max_lines=3))
        if hit is not None:
            hits.append(hit)
    notes = {line: column for n in _DEVICE_NOTE_NEEDLES for line, column in log.anchors(n)}
    for line, column in sorted(notes.items()):
        hit = _device_note(log, line, column)
        if hit is not None:
            hits.append(hit)
    return hits


def op_name(window: Window, log: LogText, line: int) -> str | None:
    """The failing node or op: `[[{{node x}}]]`, `[[Node: x = ...]]`, `[Op:X]`, `Node: 'x'`."""
    for pattern in _NODES:
        found = first_group(window.search(pattern))
        if found:
            return found
    for back in range(1, 4):
        found = first_group(_NODE_LINE.match(log.head(line - back).strip()))
        if found:
            return found
    return None


def _tensor_hit(log: LogText, line: int, window: Window) -> Hit:
    text = window.joined
    lowered = text[:3000].lower()
    shape_text = first_group(_SHAPE.search(text))
    shape = parse_shape(shape_text) if shape_text else None
    dtype = first_group(window.search(_DTYPE))
    device, device_type = device_from_spec(text)
    allocator = first_group(window.search(_ALLOCATOR))
    if device_type is None:
        device, device_type = device_from_allocator(allocator)
    requested = tensor_bytes(shape, dtype)
    if "oom when allocating" in lowered or any(cue in lowered for cue in _TF_CUES):
        framework = "tensorflow"
    else:
        framework = guess_framework(log, line, window) or "unknown"
    hint = first_group(_TF_HINT.search(" ".join(window.parts)), 0)
    info = OomInfo(
        framework=framework,
        kind=OomKind.ALLOCATOR,
        message=window.message(),
        device=device,
        device_type=device_type,
        requested_bytes=requested,
        requested_unknown_huge=is_huge(requested),
        shape=shape,
        dtype=dtype,
        op=op_name(window, log, line),
        allocator=allocator,
        hint=" ".join(hint.split()) if hint else None,
        rank=rank_of(log.lines[line][:200]),
    )
    key: tuple[object, ...] = ("shape", shape, dtype) if shape is not None else ()
    return Hit(line=line, end=window.last_line, info=info, rank=info.rank, key=key)


def _bfc_line_hit(log: LogText, line: int, window: Window) -> Hit | None:
    """`Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.00GiB (rounded to ...)`."""
    if "not a failure" in " ".join(window.parts[:2]).lower():
        # TensorFlow's own words: a retry follows, the program goes on.
        return None
    first = window.parts[0]
    match = _BFC_RAN_OUT.search(first)
    allocator = first_group(match)
    requested = first_known(to_int(first_group(match, 3)), to_bytes(first_group(match, 2)))
    device, device_type = device_from_allocator(allocator)
    hint = first_group(_FRAGMENTATION_HINT.search(" ".join(window.parts)), 0)
    parts = 1 + sum(1 for part in window.parts[1:] if "fragmentation" in part or "TF_GPU" in part)
    info = OomInfo(
        framework=bfc_framework(log, line),
        kind=OomKind.ALLOCATOR,
        message=window.message(parts),
        device=device,
        device_type=device_type,
        requested_bytes=requested,
        requested_unknown_huge=is_huge(requested),
        op=first_group(_REQUESTED_BY.search(first)),
        allocator=allocator,
        hint=" ".join(hint.split()) if hint else None,
        rank=rank_of(log.lines[line][:200]),
    )
    return Hit(
        line=line,
        end=line + parts - 1,
        info=info,
        role="prelude",
        soft=True,
        rank=info.rank,
    )


def bfc_framework(log: LogText, line: int) -> str:
    """Only TensorFlow and XLA (JAX) print BFC allocator lines; which one, the log may tell."""
    return "jax" if guess_framework(log, line) == "jax" else "tensorflow"


def _device_note(log: LogText, line: int, column: int) -> Hit | None:
    """TF1 prints the device's total and free memory at start; worth keeping for the OOM."""
    free = to_bytes(first_group(_FREE_MEMORY.search(log.lines[line][column : column + 200])))
    total = None
    for back in range(0, 4):
        total = to_bytes(first_group(_TOTAL_MEMORY.search(log.head(line - back))))
        if total is not None:
            break
    if free is None or total is None:
        return None
    info = OomInfo(framework="tensorflow", total_bytes=total, free_bytes=free, device_type="gpu")
    return Hit(line=line, end=line, info=info, role="note", soft=True, rank=rank_of(log.head(line)))
