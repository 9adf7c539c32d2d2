"""Real texts from public threads: every memory error is recognised, no other error is."""

from __future__ import annotations

import pytest
from oomtext import CATALOGUE, FORMATS, fenced_blocks, jsonl, quoted

from memdoc.oom import looks_like_memory_error, parse_all, parse_text

CORPUS = jsonl("oom-corpus-dev.jsonl")
NON_MEMORY = jsonl("non-memory-errors.jsonl")

# What each incident of the corpus must parse as: (framework, kind, library), or None for a
# text that alone does not say memory (the thread needed more logs to show it was one).
CORPUS_EXPECTED: dict[str, tuple[str, str, str | None] | None] = {
    "tf-batch-deeplab22": ("tensorflow", "allocator", None),
    "pt-kvcache-llama67": ("pytorch", "allocator", None),
    "pt-input-resshift4": ("pytorch", "allocator", None),
    "tf-batch-densenet25": ("tensorflow", "allocator", None),
    "pt-cudnn-31500": ("pytorch", "allocator", None),
    "pt-nograd-ugatit74": ("pytorch", "allocator", None),
    "tf-prealloc-43764": ("tensorflow", "disguised", "cudnn"),
    "jax-nccl-4950": None,  # a bare NCCL "unhandled system error"
    "pt-host-yolov5-8477": ("host", "host-alloc", None),
    "pt-host-dcpdn12": ("pytorch", "dataloader-killed", None),
    "pt-leak-homekit13": ("pytorch", "disguised", "cuda"),
    "jax-multifw-flax445": ("unknown", "disguised", "cublas"),
    "tf-other-cublas9489": ("tensorflow", "disguised", "cublas"),
    "tf-other-8170": ("tensorflow", "disguised", "cuda"),
}

# Catalogue blocks that are not failures: a warning TensorFlow itself says is not one, and
# PyTorch's source code that builds the message (source quotes a message, it is not one).
NOT_FAILURES = ("The caller indicates that this is not a failure", "format_size(alloc_size)")
# Catalogue blocks that do not say memory: NCCL's bare "unhandled cuda error" is far more
# often a driver, install or network fault.
NOT_MEMORY_ALONE = ("'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '",)


def test_every_corpus_incident_has_an_expectation() -> None:
    assert {entry["id"] for entry in CORPUS} == set(CORPUS_EXPECTED)


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["id"]) for e in CORPUS])
def test_corpus_incident_is_a_memory_error(entry: dict[str, str]) -> None:
    text = entry["error_text"]
    expected = CORPUS_EXPECTED[entry["id"]]
    info = parse_text(text)
    if expected is None:
        assert info is None and not looks_like_memory_error(text)
        return
    assert looks_like_memory_error(text)
    assert info is not None
    assert (info.framework, info.kind, info.library) == expected


def test_corpus_with_three_requests_gives_three_errors_the_last_one_ending_it() -> None:
    entry = next(e for e in CORPUS if e["id"] == "pt-input-resshift4")
    found = parse_all(entry["error_text"])
    assert [info.requested_bytes for info in found] == [128 * 2**30, 32 * 2**30, 8 * 2**30]
    assert parse_text(entry["error_text"]) == found[-1]


def test_non_memory_corpus_is_large_and_from_public_threads() -> None:
    assert len(NON_MEMORY) >= 25
    assert all("#" in entry["source"] and entry["error_text"] for entry in NON_MEMORY)


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["id"]) for e in NON_MEMORY])
def test_non_memory_error_is_not_a_memory_error(entry: dict[str, str]) -> None:
    assert parse_text(entry["error_text"]) is None
    assert not looks_like_memory_error(entry["error_text"])


def _sweep() -> list[object]:
    """Every fenced block of both catalogues (section 8 of the catalogue has none)."""
    return [
        pytest.param(text, id=f"{name}:{heading.lstrip('# ')[:30]}:{index}")
        for name in (CATALOGUE, FORMATS)
        for index, (heading, text) in enumerate(fenced_blocks(name))
    ]


@pytest.mark.parametrize("text", _sweep())
def test_every_catalogue_block_is_recognised(text: str) -> None:
    if any(marker in text for marker in NOT_FAILURES + NOT_MEMORY_ALONE):
        assert parse_text(text) is None
    else:
        assert parse_text(text) is not None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            quoted(CATALOGUE, "Attempting to deserialize object"), id="deserialize-on-cuda-device"
        ),
        pytest.param(
            quoted(CATALOGUE, "expandable_segments not supported"),
            id="expandable-segments-unsupported",
        ),
    ],
)
def test_catalogue_placement_messages_that_are_not_ooms_are_not_memory_errors(text: str) -> None:
    assert parse_text(text) is None
