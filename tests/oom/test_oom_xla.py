"""JAX/XLA RESOURCE_EXHAUSTED errors, BufferAssignment reports and TPU HBM texts."""

from __future__ import annotations

from typing import Any

import pytest
from oomtext import CATALOGUE, FORMATS, fenced, gib, kib, mib, quoted, quoted_lines

from memdoc.oom import parse_all, parse_text

JAX = {"framework": "jax"}


def assert_fields(text: str, expected: dict[str, Any]) -> None:
    info = parse_text(text)
    assert info is not None, text
    for name, value in expected.items():
        assert getattr(info, name) == value, (name, getattr(info, name), value)


CASES = [
    pytest.param(
        fenced(CATALOGUE, "### 6a", 0),
        {**JAX, "kind": "allocator", "requested_bytes": 5520758552},
        id="2019-local-client-replica-failed",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 6a", 1),
        {**JAX, "kind": "allocator", "requested_bytes": 40004000128},
        id="2019-runtime-error",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 6b", 0),
        {
            **JAX,
            "kind": "allocator",
            # The error's exact request wins over the allocator's rounded one.
            "requested_bytes": 37274034352,
            "allocator": "GPU_0_bfc",
            "device": 0,
            "device_type": "gpu",
            "line": 1,
        },
        id="bfc-line-joins-replica-failure",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 6c", 0),
        {
            **JAX,
            "kind": "compile",
            "requested_bytes": 6291456,
            "xla_program": "jit(concatenate)",
            "xla_buffers": (
                (
                    "concatenate f32[4096,128,3] (jit(concatenate)/jit(main)/concatenate"
                    "[dimension=0])",
                    mib(6),
                ),
            ),
            "xla_temp_bytes": 0,
        },
        id="xla-runtime-error-buffer-assignment",
    ),
    pytest.param(
        fenced(FORMATS, "### 6.4", 1),
        {**JAX, "kind": "compile", "requested_bytes": 1000000256, "xla_temp_bytes": mib(953.67)},
        id="unfiltered-stack-trace-temp",
    ),
    pytest.param(
        fenced(FORMATS, "### 6.4", 2),
        {**JAX, "kind": "compile", "requested_bytes": 4770354232, "xla_temp_bytes": gib(4.44)},
        id="large-model-temp",
    ),
    pytest.param(
        quoted(FORMATS, "3743729664"),
        {**JAX, "kind": "allocator", "requested_bytes": 3743729664},
        id="short-form",
    ),
    pytest.param(
        quoted_lines(FORMATS, "Remat warning"),
        {**JAX, "kind": "allocator", "requested_bytes": 33762398024, "line": 2},
        id="after-rematerialization-warning",
    ),
    pytest.param(
        quoted(CATALOGUE, "Out of memory allocating 40000000000"),
        {**JAX, "requested_bytes": 40000000000},
        id="out-of-memory-allocating",
    ),
    pytest.param(
        quoted(CATALOGUE, "6727663616B"),
        {**JAX, "requested_bytes": 6727663616, "device": 0, "device_type": "gpu"},
        id="failed-to-allocate-request",
    ),
    pytest.param(
        quoted(CATALOGUE, "184549376B"),
        {**JAX, "requested_bytes": 184549376, "device": 0},
        id="failed-to-allocate-request-no-class",
    ),
    pytest.param(
        quoted(CATALOGUE, "Attempting to allocate 4.39G"),
        {
            **JAX,
            "device_type": "tpu",
            "requested_bytes": round(4.39 * 1024**3),
            "free_bytes": round(2.30 * 1024**3),
        },
        id="tpu-hbm-device-buffer",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5g", 0),
        {
            "kind": "allocator",
            "device_type": "tpu",
            "requested_bytes": round(6.48 * 1024**3),
            "free_bytes": round(6.78 * 1024**3),
        },
        id="tpu-reserve-bottom-of-memory",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5g", 1),
        {
            "kind": "compile",
            "device_type": "tpu",
            "requested_bytes": round(3.95 * 1024**3),
            "free_bytes": round(1.92 * 1024**3),
            "total_bytes": gib(8),
            "xla_temp_bytes": round(3.93 * 1024**3),
            "line": 1,
        },
        id="tpu-program-hbm-requirement",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_xla_error_parses_into_its_fields(text: str, expected: dict[str, Any]) -> None:
    assert_fields(text, expected)


def test_buffer_assignment_lists_every_peak_buffer_largest_first() -> None:
    text = (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying"
        " to allocate 6291456 bytes.\nBufferAssignment OOM Debugging.\nBufferAssignment stats:\n"
        "             parameter allocation:    6.00MiB\n"
        "Peak buffers:\n"
        "        Buffer 1:\n"
        "                Size: 6.00MiB\n"
        '                Operator: op_name="jit(concatenate)/jit(main)/concatenate"\n'
        "                XLA Label: concatenate\n"
        "                Shape: f32[4096,128,3]\n"
        "                ==========================\n"
        "\n"
        "        Buffer 2:\n"
        "                Size: 384.0KiB\n"
        "                Entry Parameter Subshape: f32[256,128,3]\n"
        "                ==========================\n"
    )
    info = parse_text(text)
    assert info is not None
    assert [size for _, size in info.xla_buffers] == [mib(6), kib(384)]
    assert info.xla_buffers[1][0] == "f32[256,128,3]"


def test_the_same_xla_error_reraised_by_jax_is_one_error() -> None:
    block = fenced(CATALOGUE, "### 6c", 0)
    text = (
        f"jax._src.traceback_util.UnfilteredStackTrace: {block}\n\n"
        "The stack trace below excludes JAX-internal frames.\n"
        "The preceding is the original exception that occurred, unmodified.\n\n"
        "--------------------\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
        f"    out = f(x)\n{block}"
    )
    found = parse_all(text)
    assert len(found) == 1
    assert found[0].line == 1
