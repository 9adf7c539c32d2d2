"""TensorFlow OOM errors and BFC allocator dumps parse into the right fields."""

from __future__ import annotations

from typing import Any

import pytest
from oomtext import CATALOGUE, FORMATS, fenced, mib, quoted, quoted_lines, text_of

from memdoc.oom import parse_all, parse_text

TF = {"framework": "tensorflow", "kind": "allocator"}
GPU0 = {"device": 0, "device_type": "gpu", "allocator": "GPU_0_bfc"}


def assert_fields(text: str, expected: dict[str, Any]) -> None:
    info = parse_text(text)
    assert info is not None, text
    for name, value in expected.items():
        assert getattr(info, name) == value, (name, getattr(info, name), value)


def float_tensor(*shape: int, size: int = 4) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * size


ERRORS = [
    pytest.param(
        fenced(CATALOGUE, "### 5a", 0),
        {
            **TF,
            **GPU0,
            "shape": (64, 372, 32, 32),
            "dtype": "float",
            "requested_bytes": float_tensor(64, 372, 32, 32),
        },
        id="tf1-graph-resource-exhausted",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5a", 1),
        {
            **TF,
            "shape": (563354, 256),
            "device": 0,
            "op": "embeddings/Adam/Initializer/zeros",
            "requested_bytes": float_tensor(563354, 256),
        },
        id="tf1-tensor-of-shape-with-node",
    ),
    pytest.param(fenced(CATALOGUE, "### 5a", 2), {**TF, "shape": None}, id="tf0.7-truncated"),
    pytest.param(
        fenced(CATALOGUE, "### 5b", 0),
        {**TF, **GPU0, "shape": (2607, 192), "requested_bytes": float_tensor(2607, 192)},
        id="op-requires-line",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5b", 1),
        {
            **TF,
            **GPU0,
            "shape": (1, 896, 896, 67),
            "op": "concatenate_5_5/concat",
            "hint": "Hint: If you want to see a list of allocated tensors when OOM happens, add"
            " report_tensor_allocations_upon_oom to RunOptions for current allocation info.",
        },
        id="root-error-with-node-and-hint",
    ),
    pytest.param(
        quoted(CATALOGUE, "[Op:AddV2]"), {**TF, "op": "AddV2"}, id="eager-failed-to-allocate"
    ),
    pytest.param(
        quoted(CATALOGUE, "mul_89"), {**TF, "op": "mul_89"}, id="eager-failed-to-allocate-node"
    ),
    pytest.param(
        fenced(FORMATS, "### 6.3", 0),
        {
            **TF,
            **GPU0,
            "shape": (16, 16, 128, 128),
            "op": "bert/encoder/layer_8/attention/self/Softmax",
        },
        id="tf1-bert-node-defined-at",
    ),
    pytest.param(
        fenced(FORMATS, "### 6.3", 1),
        {
            **TF,
            **GPU0,
            "shape": (500, 512, 4, 4),
            "op": "gradient_tape/model/conv2d_19/Conv2D/Conv2DBackpropInput",
            "phase": "train",
            "line": 2,
        },
        id="tf2-keras-fit",
    ),
    pytest.param(
        quoted(FORMATS, "__wrapped__MatMul"),
        {
            **TF,
            **GPU0,
            "op": "MatMul",
            "dtype": "double",
            "requested_bytes": float_tensor(150, 2457600, size=8),
        },
        id="tf2-eager-function-node",
    ),
    pytest.param(
        quoted(FORMATS, "__wrapped__Cast"),
        {**TF, "op": "Cast", "device": 0},
        id="tf2-eager-failed-to-allocate",
    ),
    pytest.param(
        quoted_lines(FORMATS, "2 root error(s) found."),
        {**TF, **GPU0, "shape": (4, 2048, 128, 128)},
        id="tf1-multiple-root-errors",
    ),
    pytest.param(
        quoted(FORMATS, "29.91MiB"),
        {**TF, "requested_bytes": mib(29.91)},
        id="bfc-ran-out-see-logs",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5c", 2), {**TF, "requested_bytes": mib(392)}, id="bfc-ran-out-392"
    ),
    pytest.param(
        quoted_lines(FORMATS, "Newer tsl BFC"),
        {
            **TF,
            **GPU0,
            "requested_bytes": round(141.1 * 1024),
            "hint": "If the cause is memory fragmentation maybe the environment variable"
            " 'TF_GPU_ALLOCATOR=cuda_malloc_async' will improve the situation.",
        },
        id="tsl-bfc-ran-out-with-hint",
    ),
]

DUMPS = [
    pytest.param(
        fenced(CATALOGUE, "### 5c", 0),
        {
            **TF,
            "bfc_limit_bytes": 5915344896,
            "bfc_in_use_bytes": 5914959872,
            "bfc_max_in_use_bytes": 5914960384,
            "bfc_num_allocs": 1698569,
        },
        id="stats-only",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5c", 1),
        {
            **TF,
            "reserved_bytes": 1074790400,
            "bfc_limit_bytes": 3059430195,
            "bfc_in_use_bytes": 621716992,
            "reserved_unallocated_bytes": 1074790400 - 621716992,
        },
        id="region-line-and-elided-stats",
    ),
    pytest.param(
        fenced(FORMATS, "### 6.3", 2),
        {
            **TF,
            **GPU0,
            "shape": (512, 64, 56, 56),
            "bfc_limit_bytes": 15545312871,
            "bfc_in_use_bytes": 14912008192,
            "bfc_max_in_use_bytes": 14912565504,
            "bfc_num_allocs": 1073,
            "line": 1,
        },
        id="2019-dump-joins-its-op-requires-error",
    ),
    pytest.param(
        fenced(FORMATS, "### 6.3", 3),
        {
            **TF,
            "reserved_bytes": 7365066752,
            "bfc_limit_bytes": 7365066752,
            "bfc_in_use_bytes": 7151588096,
            "bfc_max_in_use_bytes": 7151588352,
            "bfc_largest_free_block_bytes": 0,
            "bfc_num_allocs": 5650,
        },
        id="2022-dump-core-path",
    ),
    pytest.param(
        fenced(FORMATS, "### 6.3", 4),
        {
            **TF,
            "shape": (32, 256, 62, 62),
            "reserved_bytes": 40231108608,
            "bfc_limit_bytes": 40231108608,
            "bfc_in_use_bytes": 40106093568,
            "bfc_max_in_use_bytes": 40230617088,
            "bfc_num_allocs": 2268042,
        },
        id="2024-dump-tsl-path",
    ),
]


@pytest.mark.parametrize(("text", "expected"), ERRORS + DUMPS)
def test_tensorflow_error_parses_into_its_fields(text: str, expected: dict[str, Any]) -> None:
    assert_fields(text, expected)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(fenced(CATALOGUE, "### 5c", 3), id="catalogue-not-a-failure"),
        pytest.param(quoted(FORMATS, "freed_by_count=0"), id="formats-not-a-failure"),
        pytest.param(quoted(FORMATS, "Garbage collection"), id="garbage-collection-warning"),
    ],
)
def test_allocator_warnings_that_say_they_are_not_failures_are_not_errors(text: str) -> None:
    assert parse_text(text) is None


def test_cpu_bfc_dump_becomes_one_error_with_every_statistic() -> None:
    """GIVEN the real CPU BFC dump TensorFlow printed (TF_CPU_BFC_MEM_LIMIT_IN_MB=256)."""
    found = parse_all(text_of("tf-cpu-bfc-dump.txt"))
    assert len(found) == 1
    info = found[0]
    assert info.framework == "tensorflow"
    assert info.kind == "allocator"
    assert info.line == 4  # the allocator's "ran out of memory" line starts the report
    assert (info.device, info.device_type) == (0, "cpu")
    assert info.allocator == "bfc_cpu_allocator_for_gpu"
    assert info.op == "Fill"  # "requested by op Fill"
    assert info.shape == (268435456,)
    assert info.dtype == "float"
    assert info.requested_bytes == 1024**3
    assert info.bfc_limit_bytes == mib(256)
    assert info.bfc_in_use_bytes == mib(64)
    assert info.bfc_max_in_use_bytes == mib(64)
    assert info.bfc_num_allocs == 3
    # The free chunk of the 2 MiB region is the largest free block.
    assert info.bfc_largest_free_block_bytes == 2096896
    assert info.bfc_bins == ((256, 1, 256), (1048576, 0, 0), (67108864, 1, mib(64)))
    assert info.reserved_bytes == mib(66)
    assert info.allocated_bytes == mib(64)
    assert info.reserved_unallocated_bytes == mib(2)
    assert info.hint is not None and "TF_GPU_ALLOCATOR=cuda_malloc_async" in info.hint
    assert "OOM when allocating tensor with shape[268435456]" in info.message


def test_device_memory_lines_of_tf1_fill_total_and_free() -> None:
    text = (
        "I tensorflow/core/common_runtime/gpu/gpu_device.cc:885] Found device 0 with properties:\n"
        "name: GeForce GTX 1080\nTotal memory: 7.92GiB\nFree memory: 190.31MiB\n"
        + fenced(CATALOGUE, "### 5e", 0)
    )
    info = parse_text(text)
    assert info is not None
    assert (info.total_bytes, info.free_bytes) == (round(7.92 * 1024**3), mib(190.31))
    assert info.line == 5  # the error, not the device note, starts it


def test_device_memory_lines_alone_are_not_an_error() -> None:
    assert parse_text("Total memory: 7.92GiB\nFree memory: 190.31MiB") is None
