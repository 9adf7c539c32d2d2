"""Regex fragments and converters the OOM parsers share: sizes, devices, shapes, dtypes."""

from __future__ import annotations

import re

from memdoc.oom.patterns import Pattern, compile_later
from memdoc.units import parse_size

# Digit runs are bounded (int() refuses strings over 4300 digits, float() of a long one is
# inf) and start only where a number starts, so a run of digits is tried once, not at each
# of its positions.
NUM = r"(?<![\d.])\d{1,30}(?:\.\d{1,30})?"
INT = r"(?<!\d)\d{1,25}"
# "226.00 MiB", "0 bytes", "6.48G", "0B", "1EB"; not the "1e" of "1e999".
SIZE = rf"{NUM}\s{{0,3}}(?:[KMGTPE]i?B|bytes?|B|[KMGTPE])(?!\w)"

# Requests at or above 1 EiB cannot be real: a size computed from garbage, an overflow, or
# the 2^64 "not available" value of NVML/cuDNN.
HUGE_BYTES = 2**60

_SPACES = compile_later(r" +")

# TensorFlow dtype names -> bytes per element.
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "qint8": 1,
    "quint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "qint32": 4,
    "int64": 8,
    "uint64": 8,
    "complex64": 8,
    "complex128": 16,
}

_DEVICE_SPEC = compile_later(r"device:(XLA_GPU|XLA_CPU|GPU|CPU|TPU):(\d{1,4})", re.IGNORECASE)
_ALLOCATOR_DEVICE = compile_later(r"^(GPU|TPU)_(\d{1,4})_bfc$", re.IGNORECASE)
_SHAPE = compile_later(r"\[\s{0,3}(\d{1,15}(?:\s{0,3},\s{0,3}\d{1,15}){0,31})?\s{0,3}\]")


def loose(pattern: str, flags: int = re.IGNORECASE) -> Pattern:
    r"""Compile `pattern` with each literal space meaning "any whitespace, or none".

    Messages reach us re-flowed: wrapped at a fixed width, or with a wrapper's spaces
    dropped. Runs of spaces collapse to one `\s*` so that no two `\s*` meet (backtracking).
    """
    return compile_later(_SPACES.sub(r"\\s*", pattern), flags)


def to_bytes(text: str | None) -> int | None:
    """Bytes from "1.39 GiB", "190.31M", "0B", "5915344896"; None when it is not a size."""
    if text is None:
        return None
    try:
        return parse_size(text.replace(",", ""))
    except (OverflowError, ValueError):
        return None


def to_int(text: str | None) -> int | None:
    """An int from a bounded digit run, None otherwise."""
    if text is None or not text.isdigit() or len(text) > 30:
        return None
    return int(text)


def first_known(*values: int | None) -> int | None:
    """The first value that is not None (0 is a value: "0 bytes free")."""
    return next((value for value in values if value is not None), None)


def is_huge(num_bytes: int | None) -> bool:
    return num_bytes is not None and num_bytes >= HUGE_BYTES


def device_from_spec(text: str) -> tuple[int | None, str | None]:
    """(index, type) from a TensorFlow device name like `/job:.../device:GPU:0`."""
    match = _DEVICE_SPEC.search(text)
    if match is None:
        return None, None
    kind = match.group(1).upper()
    device_type = "gpu" if "GPU" in kind else "tpu" if kind == "TPU" else "cpu"
    return int(match.group(2)), device_type


def device_from_allocator(name: str | None) -> tuple[int | None, str | None]:
    """(index, type) from a BFC allocator name: `GPU_0_bfc`, `bfc_cpu_allocator_for_gpu`."""
    if not name:
        return None, None
    match = _ALLOCATOR_DEVICE.match(name)
    if match is not None:
        return int(match.group(2)), match.group(1).lower()
    lowered = name.lower()
    if "cpu" in lowered or "host" in lowered:
        return None, "cpu"
    return None, None


def parse_shape(text: str) -> tuple[int, ...] | None:
    """(5760, 4, 4, 2048) from "[5760,4,4,2048]"; () for "[]"; None when not a shape."""
    match = _SHAPE.search(text)
    if match is None:
        return None
    dims = match.group(1)
    if not dims:
        return ()
    return tuple(int(d) for d in dims.replace(" ", "").split(","))


def tensor_bytes(shape: tuple[int, ...] | None, dtype: str | None) -> int | None:
    """Bytes of a dense tensor of `shape` and TensorFlow `dtype`, when both are known."""
    if shape is None or dtype is None:
        return None
    size = DTYPE_BYTES.get(dtype.lower())
    if size is None:
        return None
    count = 1
    for dim in shape:
        count *= dim
    return count * size


def first_group(match: re.Match[str] | None, group: int = 1) -> str | None:
    if match is None:
        return None
    return match.group(group)
