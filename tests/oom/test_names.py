"""Names are matched word by word, never as substrings."""

from __future__ import annotations

import pytest

from memdoc.oom.names import has_words, name_words


@pytest.mark.parametrize(
    ("name", "words"),
    [
        pytest.param("_load_pretrained_model", ("load", "pretrained", "model"), id="snake"),
        pytest.param("CUDAGraph", ("cuda", "graph"), id="acronym-then-word"),
        pytest.param("DataLoader.__iter__", ("data", "loader", "iter"), id="camel-and-dunder"),
        pytest.param("conv2d", ("conv2d",), id="digits-stay-with-their-word"),
        pytest.param(
            "train.py:12:evaluateModel", ("train", "py", "12", "evaluate", "model"), id="frame"
        ),
    ],
)
def test_a_name_splits_into_its_words(name: str, words: tuple[str, ...]) -> None:
    assert name_words(name) == words


@pytest.mark.parametrize(
    ("name", "phrases", "expected"),
    [
        pytest.param("test_step", ["test"], True, id="test-is-a-word-of-test_step"),
        pytest.param("latest_checkpoint", ["test"], False, id="test-is-not-in-latest"),
        pytest.param("_load_from_state_dict", ["load"], True, id="load-is-a-word"),
        pytest.param("dataloader_iter", ["load"], False, id="load-is-not-in-dataloader"),
        pytest.param("DataLoader", ["load"], False, id="loader-is-not-load"),
        pytest.param("capture_cuda_graph", ["cuda graph"], True, id="phrase-in-a-row"),
        pytest.param("build_graph", ["cuda graph"], False, id="any-graph-is-not-a-cuda-graph"),
        pytest.param("graph_cuda", ["cuda graph"], False, id="phrase-order-matters"),
        pytest.param("ConvertElementType", ["conv"], False, id="conv-is-not-in-convert"),
    ],
)
def test_phrases_match_whole_words_in_a_row(name: str, phrases: list[str], expected: bool) -> None:
    assert has_words(name, phrases) is expected
