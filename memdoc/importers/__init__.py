"""Importers: files other tools wrote (snapshots, nvidia-smi logs, profiles) read as traces."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

from memdoc.errors import InputError
from memdoc.files import require_regular_file
from memdoc.importers.build import TraceBuilder, save_trace
from memdoc.importers.jax_pprof import import_jax_profile
from memdoc.importers.nvidia_smi import MAX_TEXT_BYTES, import_nvidia_smi, looks_like_smi
from memdoc.importers.snapshot_import import import_snapshot
from memdoc.importers.tf_xplane import import_xspace, looks_like_xspace
from memdoc.importers.torch_profiler import (
    import_chrome_trace,
    import_memory_timeline,
    is_chrome_trace,
    is_memory_timeline,
    load_json,
)
from memdoc.trace.reader import Run, Trace, load_trace, looks_like_trace

__all__ = [
    "KINDS",
    "TraceBuilder",
    "detect",
    "import_files",
    "load_any",
    "save_trace",
]

MEMDOC_TRACE = "memdoc-trace"
TORCH_SNAPSHOT = "torch-snapshot"
TORCH_PROFILER_TRACE = "torch-profiler-trace"
TORCH_MEMORY_TIMELINE = "torch-memory-timeline"
NVIDIA_SMI = "nvidia-smi"
JAX_MEMORY_PROFILE = "jax-memory-profile"
TF_XPLANE = "tf-xplane"
KINDS = (
    MEMDOC_TRACE,
    TORCH_SNAPSHOT,
    TORCH_PROFILER_TRACE,
    TORCH_MEMORY_TIMELINE,
    NVIDIA_SMI,
    JAX_MEMORY_PROFILE,
    TF_XPLANE,
)
_HEAD_BYTES = 1024 * 1024  # text logs can start with a page of other output
_READABLE = (
    "memdoc reads memdoc traces, PyTorch memory snapshots (.pickle), nvidia-smi output "
    "(-q -x XML, -q text, --query-gpu/--query-compute-apps CSV, dmon/pmon), PyTorch profiler "
    "traces and memory timelines, JAX memory profiles (.prof) and TensorFlow .xplane.pb files; "
    "for an nvidia-smi CSV log written with noheader, pass its fields with --columns"
)


def detect(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> str | None:
    """What a file is, from its content (never its name); None when memdoc cannot read it.

    Raises:
        InputError: the file is missing or unreadable.
    """
    path = Path(path)
    head, gzipped = _head(path)
    # The header line names the format: only then is the (costly) header check worth it.
    if b'"memdoc-trace"' in head[:4096] and looks_like_trace(path):
        return MEMDOC_TRACE
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return TORCH_SNAPSHOT
    text = head.lstrip()[:1]
    if text == b"{" and any(k in head for k in (b'"traceEvents"', b'"deviceProperties"')):
        return TORCH_PROFILER_TRACE
    if text == b"[" and head.lstrip()[1:].lstrip()[:1] == b"[":
        return TORCH_MEMORY_TIMELINE
    if gzipped and b"space" in head and b"bytes" in head and not _is_text(head):
        return JAX_MEMORY_PROFILE
    if looks_like_xspace(head):
        return TF_XPLANE
    if _is_text(head) and looks_like_smi(head.decode("utf-8", errors="replace"), columns):
        return NVIDIA_SMI
    return None


def _head(path: Path) -> tuple[bytes, bool]:
    """The first bytes of the file, decompressed when it is gzip.

    Raises:
        InputError: missing, unreadable, a folder, or a pipe or a device (which could block).
    """
    require_regular_file(path)
    try:
        with open(path, "rb") as stream:
            raw = stream.read(_HEAD_BYTES)
    except (FileNotFoundError, UnicodeEncodeError, ValueError):
        # A name no file can have (a NUL, a lone surrogate) names no file.
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if raw[:2] != b"\x1f\x8b":
        return raw, False
    try:
        return zlib.decompressobj(wbits=31).decompress(raw, _HEAD_BYTES), True
    except zlib.error:
        return b"", True


def _is_text(head: bytes) -> bool:
    return b"\x00" not in head[:4096]


def import_files(
    paths: Sequence[str | os.PathLike[str]], columns: Sequence[str] | None = None
) -> Trace:
    """Convert files of other tools about one run into one trace, lined up by wall clock.

    Raises:
        InputError: a file memdoc cannot read, or one that is damaged (one line, the file named).
    """
    builder = TraceBuilder()
    for raw_path in paths:
        path = Path(raw_path)
        kind = detect(path, columns)
        if kind == MEMDOC_TRACE:
            raise InputError(f"{path}: already a memdoc trace; nothing to import")
        _import(path, kind, builder, columns)
    return builder.build()


def load_any(paths: Sequence[str | os.PathLike[str]], columns: Sequence[str] | None = None) -> Run:
    """memdoc traces as they are, and every other file converted in memory into one more trace.

    Raises:
        InputError, TraceError: a file memdoc cannot read, or a damaged one.
    """
    traces: list[Trace] = []
    foreign: list[Path] = []
    for raw_path in paths:
        path = Path(raw_path)
        if detect(path, columns) == MEMDOC_TRACE:
            traces.append(load_trace(path))
        else:
            foreign.append(path)
    if foreign:
        traces.insert(0, import_files(foreign, columns))
    return Run(traces)


def _import(
    path: Path, kind: str | None, builder: TraceBuilder, columns: Sequence[str] | None
) -> None:
    if kind == TORCH_SNAPSHOT:
        import_snapshot(path, builder)
    elif kind in (TORCH_PROFILER_TRACE, TORCH_MEMORY_TIMELINE):
        data = load_json(path)
        if is_chrome_trace(data):
            import_chrome_trace(data, path, builder)
        elif is_memory_timeline(data):
            import_memory_timeline(data, path, builder)
        else:
            raise InputError(f"{path}: JSON that is neither a profiler trace nor a timeline")
    elif kind == JAX_MEMORY_PROFILE:
        import_jax_profile(path, builder)
    elif kind == TF_XPLANE:
        import_xspace(path, builder)
    elif kind == NVIDIA_SMI:
        import_nvidia_smi(path, _text(path), builder, columns)
    else:
        raise InputError(f"{path}: not a file memdoc can read", hint=_READABLE)


def _text(path: Path) -> str:
    _, gzipped = _head(path)
    try:
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as stream:
            data = stream.read(MAX_TEXT_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: cannot read it ({exc})") from None
    if len(data) > MAX_TEXT_BYTES:
        raise InputError(f"{path}: larger than any nvidia-smi log memdoc reads")
    return data.decode("utf-8", errors="replace")
