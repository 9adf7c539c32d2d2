"""One table says whether a line about memory is about a GPU, for every reader that asks."""

from __future__ import annotations

import pytest

from memdoc.oom.disguised import GPU_WORDS_PATTERN


@pytest.mark.parametrize(
    ("line", "on_gpu"),
    [
        pytest.param("cudaMalloc failed: out of memory", True, id="cuda-api"),
        pytest.param("hipErrorOutOfMemory", True, id="hip-api"),
        pytest.param("ran out of VRAM", True, id="vram"),
        pytest.param("MPS backend out of memory", True, id="mps"),
        pytest.param("显存不足", True, id="chinese"),
        pytest.param("[TRT] out of memory", True, id="tensorrt"),
        pytest.param("out of memory on an RTX 4090", True, id="model-name"),
        pytest.param("the relationship table ran out of memory", False, id="hip-inside-a-word"),
        pytest.param("MemoryError: out of RAM", False, id="host"),
    ],
)
def test_a_line_is_about_a_gpu_by_the_one_table(line: str, on_gpu: bool) -> None:
    assert (GPU_WORDS_PATTERN.search(line) is not None) is on_gpu
