"""Allocator settings from the environment, as the frameworks themselves would read them."""

from __future__ import annotations

from typing import Any

import pytest

from memdoc.collectors.allocator_conf import (
    jax_alloc_conf,
    split_torch_conf,
    tf_alloc_conf,
    torch_alloc_conf,
)

MiB = 1024**2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("expandable_segments:True", {"expandable_segments": True}, id="expandable"),
        pytest.param(
            "max_split_size_mb:128,garbage_collection_threshold:0.6",
            {"max_split_size_bytes": 128 * MiB, "garbage_collection_threshold": 0.6},
            id="split-and-gc",
        ),
        pytest.param("backend:cudaMallocAsync", {"backend": "cudaMallocAsync"}, id="async"),
        pytest.param("roundup_power2_divisions:4", {"roundup_power2_divisions": 4}, id="roundup"),
        pytest.param(
            "roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments:False",
            {
                "roundup_power2_divisions": {"256": 1, "512": 2, ">": 8},
                "expandable_segments": False,
            },
            id="roundup-table-keeps-its-commas",
        ),
        pytest.param(
            " max_split_size_mb : 512 , expandable_segments:True ",
            {"max_split_size_bytes": 512 * MiB, "expandable_segments": True},
            id="spaces",
        ),
    ],
)
def test_pytorch_alloc_conf_values_are_read_with_units_in_bytes(
    value: str, expected: dict[str, Any]
) -> None:
    conf = torch_alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": value})

    assert {k: conf[k] for k in expected} == expected
    assert conf["env"] == {"PYTORCH_CUDA_ALLOC_CONF": value}
    assert "invalid" not in conf


def test_the_newer_pytorch_alloc_conf_wins_over_the_deprecated_name() -> None:
    conf = torch_alloc_conf(
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "backend:native"}
    )

    assert conf["env"] == {"PYTORCH_ALLOC_CONF": "backend:native"}
    assert "max_split_size_bytes" not in conf


def test_without_a_setting_pytorch_uses_its_native_allocator_and_nothing_else_is_claimed() -> None:
    assert torch_alloc_conf({}) == {"framework": "pytorch", "backend": "native"}


@pytest.mark.parametrize(
    ("value", "invalid", "other"),
    [
        pytest.param("expandable_segments:yes please", ["expandable_segments:yes please"], {}),
        pytest.param("max_split_size_mb:-5", ["max_split_size_mb:-5"], {}),
        pytest.param("max_split_size_mb:inf", ["max_split_size_mb:inf"], {}),
        pytest.param("garbage_collection_threshold:1.5", ["garbage_collection_threshold:1.5"], {}),
        pytest.param("backend:magic", ["backend:magic"], {}),
        pytest.param("roundup_power2_divisions:[256:x]", ["roundup_power2_divisions:[256:x]"], {}),
        pytest.param("pinned_num_register_threads:8", [], {"pinned_num_register_threads": "8"}),
    ],
)
def test_values_pytorch_would_reject_are_listed_not_guessed(
    value: str, invalid: list[str], other: dict[str, str]
) -> None:
    conf = torch_alloc_conf({"PYTORCH_ALLOC_CONF": value})

    assert conf.get("invalid", []) == invalid
    assert conf.get("other", {}) == other
    assert conf["backend"] == "native"


def test_split_keeps_bracketed_lists_whole_and_drops_empty_parts() -> None:
    assert split_torch_conf("a:1,,b:[2:3,4:5],c") == [("a", "1"), ("b", "[2:3,4:5]"), ("c", "")]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, {"gpu_allocator": "bfc", "backend": "bfc"}, id="defaults"),
        pytest.param(
            {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "TF_GPU_ALLOCATOR": "cuda_malloc_async"},
            {
                "allow_growth": True,
                "gpu_allocator": "cuda_malloc_async",
                "backend": "cudaMallocAsync",
            },
            id="growth-and-async",
        ),
        pytest.param(
            {"TF_FORCE_GPU_ALLOW_GROWTH": "false"}, {"allow_growth": False}, id="growth-off"
        ),
        pytest.param(
            {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "256"},
            {"cpu_allocator": "bfc", "cpu_memory_limit_bytes": 256 * MiB},
            id="cpu-bfc-with-limit",
        ),
        pytest.param(
            {"TF_CPU_BFC_MEM_LIMIT_IN_MB": "256"}, {}, id="limit-without-bfc-means-nothing"
        ),
    ],
)
def test_tensorflow_allocator_switches(environ: dict[str, str], expected: dict[str, Any]) -> None:
    conf = tf_alloc_conf(environ)

    assert {k: conf.get(k) for k in expected} == expected
    if "TF_CPU_ALLOCATOR_USE_BFC" not in environ:
        assert "cpu_allocator" not in conf and "cpu_memory_limit_bytes" not in conf


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {},
            {"preallocate": True, "mem_fraction": 0.75, "gpu_allocator": "default"},
            id="jax-preallocates-three-quarters-by-default",
        ),
        pytest.param(
            {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".3"},
            {"preallocate": False, "mem_fraction": 0.3},
            id="preallocation-off",
        ),
        pytest.param(
            {"XLA_PYTHON_CLIENT_PREALLOCATE": "no"}, {"preallocate": True}, id="only-false-or-0"
        ),
        pytest.param(
            {"XLA_CLIENT_MEM_FRACTION": "0.5"}, {"mem_fraction": 0.5}, id="newer-fraction-name"
        ),
        pytest.param(
            {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
            {"gpu_allocator": "platform", "backend": "platform"},
            id="platform-allocator",
        ),
    ],
)
def test_xla_client_settings_with_jax_defaults_filled_in(
    environ: dict[str, str], expected: dict[str, Any]
) -> None:
    conf = jax_alloc_conf(environ)

    assert {k: conf[k] for k in expected} == expected
    assert conf.get("env", {}) == environ
