"""PyTorch allocator OOM messages, every era in the catalogue, parse into the right fields."""

from __future__ import annotations

from typing import Any

import pytest
from oomtext import CATALOGUE, FORMATS, fenced, gib, kib, mib, phrase, quoted

from memdoc.oom import parse_all, parse_text
from memdoc.trace.model import ProcessUsage


def assert_fields(text: str, expected: dict[str, Any]) -> None:
    info = parse_text(text)
    assert info is not None, text
    for name, value in expected.items():
        assert getattr(info, name) == value, (name, getattr(info, name), value)


ALLOCATOR = {"framework": "pytorch", "kind": "allocator", "device_type": "gpu"}

ERAS = [
    pytest.param(
        fenced(CATALOGUE, "### 1a", 0),
        {**ALLOCATOR, "requested_bytes": None, "total_bytes": None},
        id="0.x-thc-cuda-runtime-error-2",
    ),
    pytest.param(fenced(CATALOGUE, "### 1a", 1), ALLOCATOR, id="0.x-thc-runtime-err-2"),
    pytest.param(fenced(CATALOGUE, "### 1b", 0), ALLOCATOR, id="0.4-thcudacheck-error-2"),
    pytest.param(fenced(CATALOGUE, "### 1b", 1), ALLOCATOR, id="0.4-aten-runtime-error"),
    pytest.param(
        fenced(CATALOGUE, "### 1c", 0),
        {
            **ALLOCATOR,
            "device": 0,
            "requested_bytes": kib(1024),
            "total_bytes": gib(11.17),
            "allocated_bytes": gib(10.90),
            "free_bytes": kib(576),
            # Before 1.5 "cached" was the pool's free part, so reserved = allocated + cached.
            "reserved_unallocated_bytes": mib(30.96),
            "reserved_bytes": gib(10.90) + mib(30.96),
        },
        id="1.0-cached",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1c", 1),
        {**ALLOCATOR, "requested_bytes": mib(1024), "reserved_unallocated_bytes": kib(607)},
        id="1.0-cached-kib",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1d", 0),
        {
            **ALLOCATOR,
            "device": 0,
            "requested_bytes": mib(60),
            "total_bytes": gib(11.17),
            "allocated_bytes": mib(505.96),
            "free_bytes": mib(12.50),
            "reserved_bytes": mib(530),
            "reserved_unallocated_bytes": mib(530) - mib(505.96),
            "hint": None,
        },
        id="1.5-reserved-in-total",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1e", 0),
        {
            **ALLOCATOR,
            "requested_bytes": gib(1.39),
            "total_bytes": gib(6.00),
            "allocated_bytes": gib(4.04),
            "free_bytes": mib(478),
            "reserved_bytes": gib(4.15),
            "hint": "If reserved memory is >> allocated memory try setting max_split_size_mb to"
            " avoid fragmentation. See documentation for Memory Management and"
            " PYTORCH_CUDA_ALLOC_CONF",
        },
        id="1.10-max-split-hint",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1f", 0),
        {
            **ALLOCATOR,
            "device": 0,
            "requested_bytes": mib(32),
            "total_bytes": gib(4.00),
            "free_bytes": mib(41.56),
            "this_process_bytes": gib(3.44),
            "allocated_bytes": gib(2.58),
            "reserved_unallocated_bytes": mib(1.90),
            "reserved_bytes": gib(2.58) + mib(1.90),
            "processes": (ProcessUsage(pid=None, used_bytes=gib(3.44), this_process=True),),
        },
        id="2.1-capacty-typo-this-process",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1f", 1),
        {
            **ALLOCATOR,
            "requested_bytes": gib(12),
            "total_bytes": gib(47.54),
            "free_bytes": gib(11),
            "this_process_bytes": None,
            "allocated_bytes": gib(23.57),
            "reserved_unallocated_bytes": gib(12.12),
            "processes": (ProcessUsage(pid=445260, used_bytes=gib(36.53)),),
        },
        id="2.1-process-line",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1f", 2),
        {
            **ALLOCATOR,
            "requested_bytes": gib(2),
            "free_bytes": gib(2.80),
            "allocated_bytes": 0,
            "reserved_unallocated_bytes": 0,
            "processes": (),
        },
        id="2.1-nothing-allocated",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1g", 0),
        {
            **ALLOCATOR,
            "device": 0,
            "requested_bytes": mib(226),
            "total_bytes": gib(15.58),
            "free_bytes": mib(71.25),
            "this_process_bytes": gib(13.94),
            "allocated_bytes": gib(13.64),
            "reserved_unallocated_bytes": mib(67.23),
            "hint": "If reserved but unallocated memory is large try setting"
            " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation. See"
            " documentation for Memory Management"
            " (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
            "line": 1,
        },
        id="2.2-this-process",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1g", 1),
        {
            **ALLOCATOR,
            "requested_bytes": gib(35.60),
            "total_bytes": gib(79.33),
            "free_bytes": gib(26.16),
            "processes": (ProcessUsage(pid=76883, used_bytes=gib(53.16)),),
            "allocated_bytes": gib(11.97),
            "reserved_unallocated_bytes": gib(40.69),
        },
        id="2.2-no-exception-class",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 1g", 2),
        {
            **ALLOCATOR,
            "requested_bytes": mib(546),
            "private_pool_bytes": mib(46),
            "allocated_bytes": gib(13.73),
            "reserved_unallocated_bytes": mib(736.86),
            "processes": (ProcessUsage(pid=562167, used_bytes=gib(15.25)),),
        },
        id="2.2-cuda-graph-private-pool",
    ),
    pytest.param(
        quoted(CATALOGUE, "[rank6]: torch.OutOfMemoryError"),
        {
            **ALLOCATOR,
            "rank": 6,
            "device": 6,
            "requested_bytes": mib(270),
            "total_bytes": gib(23.65),
            "processes": (ProcessUsage(pid=2271801, used_bytes=gib(23.44)),),
        },
        id="2.2-rank-prefix",
    ),
]

FORMAT_HISTORY = [
    pytest.param(
        quoted(FORMATS, "2.56 GiB"),
        {**ALLOCATOR, "requested_bytes": gib(2.56), "reserved_unallocated_bytes": gib(2.99)},
        id="history-1.0-cached",
    ),
    pytest.param(
        quoted(FORMATS, "0 bytes free; 6.00 GiB reserved"),
        {**ALLOCATOR, "free_bytes": 0, "reserved_bytes": gib(6), "reserved_unallocated_bytes": 0},
        id="history-1.5-zero-free",
    ),
    pytest.param(
        quoted(FORMATS, "18.92 GiB allowed"),
        {**ALLOCATOR, "limit_bytes": gib(18.92), "reserved_bytes": gib(13.85)},
        id="history-memory-fraction-cap",
    ),
    pytest.param(
        quoted(FORMATS, "Process 2006998"),
        {
            **ALLOCATOR,
            "requested_bytes": gib(32),
            "this_process_bytes": gib(9.30),
            "reserved_unallocated_bytes": kib(982.50),
            "processes": (
                ProcessUsage(pid=2006998, used_bytes=mib(256)),
                ProcessUsage(pid=None, used_bytes=gib(9.30), this_process=True),
            ),
        },
        id="history-2.1-other-process-and-this-one",
    ),
    pytest.param(
        quoted(FORMATS, "Process 3258"),
        {**ALLOCATOR, "processes": (ProcessUsage(pid=3258, used_bytes=gib(14.73)),)},
        id="history-2.1-own-process-by-pid",
    ),
    pytest.param(
        quoted(FORMATS, "17179869184.00 GiB"),
        # NVML's 2^64 "not available" value, kept as the number it says.
        {**ALLOCATOR, "this_process_bytes": 2**64, "requested_bytes": mib(20)},
        id="history-2.1-nvml-2-to-the-64",
    ),
    pytest.param(
        quoted(FORMATS, "960.00 MiB"),
        {**ALLOCATOR, "free_bytes": gib(15.52), "processes": (), "allocated_bytes": gib(6.78)},
        id="history-2.2-windows-no-nvml",
    ),
    pytest.param(
        quoted(FORMATS, "OutOfMemoryError: CUDA out of memory. Tried to allocate 37252902.99"),
        {
            **ALLOCATOR,
            "requested_bytes": gib(37252902.99),
            "requested_unknown_huge": False,
            "total_bytes": gib(14.74),
            "processes": (ProcessUsage(pid=8366, used_bytes=mib(100)),),
        },
        id="history-2.2-request-larger-than-device",
    ),
    pytest.param(
        quoted(FORMATS, "RuntimeError: CUDA out of memory. Tried to allocate 37252902.99"),
        {**ALLOCATOR, "requested_bytes": gib(37252902.99), "total_bytes": gib(14.74)},
        id="history-torchscript-truncated",
    ),
    pytest.param(
        quoted(FORMATS, "DefaultCPUAllocator"),
        {"framework": "pytorch", "kind": "host-alloc", "device_type": "cpu"},
        id="history-default-cpu-allocator",
    ),
]

IMPOSSIBLE_REQUESTS = [
    pytest.param(
        quoted(CATALOGUE, "538976288.13 GiB"),
        {"requested_bytes": gib(538976288.13), "device": 1, "total_bytes": gib(47.54)},
        id="garbage-size-below-1eib",
    ),
    pytest.param(
        quoted(CATALOGUE, "130674.91 GiB"),
        {"requested_bytes": gib(130674.91), "total_bytes": gib(79.15)},
        id="overflowed-size",
    ),
    pytest.param(
        phrase(CATALOGUE, "CUDA Out of Memory when trying to allocate 16 EiB"),
        {"requested_bytes": 16 * 2**60, "requested_unknown_huge": True},
        id="16-eib",
    ),
    pytest.param(
        quoted(CATALOGUE, "more than 1EB"),
        # A lower bound, kept as a number and flagged.
        {"requested_bytes": 2**60, "requested_unknown_huge": True},
        id="more-than-1eb",
    ),
]


@pytest.mark.parametrize(("text", "expected"), ERAS + FORMAT_HISTORY)
def test_pytorch_message_parses_into_its_fields(text: str, expected: dict[str, Any]) -> None:
    assert_fields(text, expected)


@pytest.mark.parametrize(("text", "expected"), IMPOSSIBLE_REQUESTS)
def test_impossible_requests_keep_their_numbers(text: str, expected: dict[str, Any]) -> None:
    assert_fields(text, {"framework": "pytorch", "kind": "allocator", **expected})


def test_thc_check_and_runtime_error_of_one_failure_are_one_error() -> None:
    text = fenced(CATALOGUE, "### 1b", 0) + "\n" + fenced(CATALOGUE, "### 1b", 1)
    assert len(parse_all(text)) == 1


def test_mps_allocator_message_gives_allocated_and_cap() -> None:
    # The wording of PyTorch's MPS allocator (Apple GPUs), as users report it.
    text = (
        "RuntimeError: MPS backend out of memory (MPS allocated: 17.61 GB, other allocations:"
        " 1.38 GB, max allowed: 18.13 GB). Tried to allocate 256 bytes on shared pool. Use"
        " PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations"
        " (may cause system failure)."
    )
    assert_fields(
        text,
        {
            **ALLOCATOR,
            "requested_bytes": 256,
            "allocated_bytes": gib(17.61),
            "limit_bytes": gib(18.13),
            "allocator": "mps",
        },
    )
    info = parse_text(text)
    assert info is not None and info.hint is not None
    assert info.hint.startswith("Use PYTORCH_MPS_HIGH_WATERMARK_RATIO")


def test_message_stops_at_the_end_of_the_error() -> None:
    text = fenced(CATALOGUE, "### 1g", 0) + "\n  0%|          | 0/10 [00:00<?, ?it/s]"
    info = parse_text(text)
    assert info is not None
    assert info.message == fenced(CATALOGUE, "### 1g", 0)
