"""For any text the parsers answer, never raise, and keep their answers consistent."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from oomtext import CATALOGUE, FORMATS, fenced_blocks, jsonl, text_of

from memdoc.oom import headline, looks_like_memory_error, parse_all, parse_text
from memdoc.oom.logtext import LogText
from memdoc.trace.model import OomInfo

REAL = [text for name in (CATALOGUE, FORMATS) for _, text in fenced_blocks(name)]
REAL += [entry["error_text"] for entry in jsonl("oom-corpus-dev.jsonl")]
REAL += [entry["error_text"] for entry in jsonl("non-memory-errors.jsonl")[:10]]
REAL.append(text_of("tf-cpu-bfc-dump.txt"))

# Pieces that sit next to numbers and units in real messages, and numbers no parser expects.
JUNK = [
    "1e999",
    "nan GiB",
    "inf MiB",
    "-1 GiB",
    "1" * 400,
    "9" * 5000 + " GiB",
    "0." + "0" * 300 + "1 KiB",
    "18446744073709551616 bytes",
    "Tried to allocate ",
    "Process ",
    " has ",
    " memory in use. ",
    "shape[",
    "] and type ",
    "[rank",
    "]: ",
    "E   ",
    "InUse:",
    "MaxInUse:",
    "Stats: ",
    "Bin (",
    "Killed",
    "exit code 137",
    "(pid: ",
    "Size: ",
    "Buffer 1:",
    "rounded to ",
    "\n",
    "\r",
    "\r\n",
    "\t",
    " ",
    "",
]

fragment = st.one_of(
    st.sampled_from(REAL),
    st.builds(
        lambda text, start, length: text[start : start + length],
        st.sampled_from(REAL),
        st.integers(0, 600),
        st.integers(0, 900),
    ),
    st.sampled_from(JUNK),
    st.text(max_size=30),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: f"{f} GiB"),
)
spliced = st.lists(fragment, max_size=10).map("".join)


def check_answers(text: str) -> list[OomInfo]:
    found = parse_all(text)
    assert isinstance(found, list)
    assert all(isinstance(info, OomInfo) for info in found)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").count("\n") + 1
    for info in found:
        assert info.line is not None and 1 <= info.line <= lines
        assert OomInfo.from_dict(info.to_dict()) == info
    assert [info.line for info in found] == sorted(info.line or 0 for info in found)
    last = parse_text(text)
    assert last == (found[-1] if found else None)
    assert looks_like_memory_error(text) is (last is not None)
    return found


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_any_text_gets_an_answer_and_no_exception(text: str) -> None:
    check_answers(text)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spliced)
def test_real_fragments_spliced_with_junk_get_consistent_answers(text: str) -> None:
    check_answers(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spliced, st.integers(1, 40))
def test_lines_of_noise_before_a_text_only_move_its_errors_down(text: str, count: int) -> None:
    # A headline ("CUDA OOM when loading the state dict") is read only as a whole text.
    assume(not headline.find(LogText(text)))
    noise = "2024-05-01 12:00:00 INFO step 10 loss=0.5000\n" * count
    moved = parse_all(noise + text)
    assert moved == [replace(info, line=(info.line or 0) + count) for info in parse_all(text)]


# Two Stats blocks in a row, and a stray `InUse:` line above one: where the text starts must
# not change which lines a block is read from (both found by the property above).
_STATS = (
    "Limit:                      7365066752\nInUse:                      7151588096\n"
    "MaxInUse:                   7151588352\nNumAllocs:                        5650\n"
    "MaxAllocSize:                176947200\nReserved:                            0\n"
    "PeakReserved:                        0\nLargestFreeBlock:                    {free}"
)
_CUDNN = (
    "  Profiling failure on CUDNN engine 1: RESOURCE_EXHAUSTED: Allocating 4718624784 bytes "
    "exceeds the memory limit of 4294967296 bytes.\n"
)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            _STATS.format(free=7365066752) + "\n" + _STATS.format(free=0).split("\n", 1)[1],
            id="a-second-block-without-its-limit",
        ),
        pytest.param(
            "InUse:No algorithm worked!  Error messages:\n"
            + _CUDNN * 2
            + "I tensorflow/core/common_runtime/bfc_allocator.cc:1101] Sum Total of in-use "
            "chunks: 6.66GiB\n"
            "I tensorflow/core/common_runtime/bfc_allocator.cc:1109] Stats: \n"
            + _STATS.format(free=0),
            id="a-stray-inuse-above",
        ),
    ],
)
@pytest.mark.parametrize("count", [1, 2, 5])
def test_a_bfc_dump_reads_the_same_wherever_the_text_starts(text: str, count: int) -> None:
    noise = "2024-05-01 12:00:00 INFO step 10 loss=0.5000\n" * count
    moved = parse_all(noise + text)
    assert moved == [replace(info, line=(info.line or 0) + count) for info in parse_all(text)]


def test_an_absurd_printed_figure_survives_a_save_and_a_load() -> None:
    # Found by the property above: a size far beyond 64 bits, parsed as printed.
    text = (
        "RuntimeError: cuda runtime error (2) : out of memory at /conda-bld/pytorch-0.1.9"
        "(local)1e999EB ALREADYALLOCATED"
    )

    (info,) = parse_all(text)

    assert info.allocated_bytes is not None and info.allocated_bytes > 2**64
    assert OomInfo.from_dict(info.to_dict()) == info
