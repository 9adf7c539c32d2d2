"""`memdoc explain` on any text at all: one answer, the JSON contract, never a traceback."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, memdoc_cmd
from tests.faults.cli_in_process import memdoc

FRAMEWORKS = {"pytorch", "tensorflow", "jax", "host", "unknown"}


def _texts(name: str) -> list[str]:
    with (FIXTURES / name).open(encoding="utf-8") as lines:
        return [json.loads(line)["error_text"] for line in lines if line.strip()]


REAL_ERRORS = _texts("oom-corpus-dev.jsonl") + _texts("non-memory-errors.jsonl")
# Words the parsers look for, so that generated texts reach past the first regex.
VOCABULARY = [
    "CUDA out of memory.",
    "Tried to allocate",
    "GiB",
    "MiB",
    "KiB",
    "bytes",
    "EiB",
    "GPU",
    "GPU 0",
    "has a total capacity of",
    "of which",
    "is free.",
    "Process",
    "has",
    "memory in use.",
    "Of the allocated memory",
    "is allocated by PyTorch, and",
    "is reserved by PyTorch but unallocated.",
    "allowed;",
    "ResourceExhaustedError",
    "OOM when allocating tensor with shape[",
    "]",
    "and type float",
    "on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
    "RESOURCE_EXHAUSTED:",
    "Out of memory while trying to allocate",
    "XlaRuntimeError",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "Killed",
    "DataLoader worker (pid 123) is killed by signal: Killed.",
    "Bus error",
    "torch.OutOfMemoryError:",
    "RuntimeError:",
    "MemoryError",
    "\n",
    "  ",
    "rank3]:",
    "-1",
    "nan",
    "inf",
    "1e400",
    "99999999999999999999999",
    "(",
    ")",
    ":",
    ",",
    "%",
    "Traceback (most recent call last):",
]


@st.composite
def mutated_real_errors(draw: st.DrawFn) -> str:
    """A real error text, cut, spliced, repeated and with its numbers changed."""
    text = draw(st.sampled_from(REAL_ERRORS))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["cut", "insert", "repeat", "number", "truncate"]))
        if action == "cut":
            text = text[:at] + text[at + draw(st.integers(0, 200)) :]
        elif action == "insert":
            text = text[:at] + draw(st.text(max_size=40) | st.sampled_from(VOCABULARY)) + text[at:]
        elif action == "repeat":
            text = text[:at] * draw(st.integers(1, 3)) + text[at:]
        elif action == "number":
            text = (
                text[:at]
                + str(draw(st.integers(-(2**70), 2**70) | st.floats(allow_nan=True)))
                + text[at:]
            )
        else:
            text = text[:at]
    return text


composed_errors = st.lists(
    st.one_of(
        st.sampled_from(VOCABULARY),
        st.integers(-(2**66), 2**66).map(str),
        st.floats().map(str),
        st.text(max_size=12),
    ),
    max_size=40,
).map(" ".join)

any_text = st.text(max_size=2000)


@pytest.fixture(scope="module")
def error_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("explain") / "error.log"


def _refuse_nan(name: str) -> float:
    raise AssertionError(f"explain --json printed {name}, which is not JSON")


def assert_explains(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    said = memdoc("explain", str(path), "--json")
    assert said.status in (0, 3), said.stderr  # 3: a memory problem was found
    assert not said.stderr or all(line.startswith("memdoc: ") for line in said.stderr.splitlines())
    answer = json.loads(said.stdout, parse_constant=_refuse_nan)
    assert set(answer) == {"oom", "findings"}
    oom = answer["oom"]
    assert oom is None or oom.get("framework", "unknown") in FRAMEWORKS
    confidences = [f["confidence"] for f in answer["findings"]]
    assert all(0.0 <= c <= 1.0 for c in confidences)
    assert confidences == sorted(confidences, reverse=True)
    if oom is None:
        assert answer["findings"] == []


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,  # the same cases on every run: CI stays reproducible
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )


@fuzz(1000)
@given(text=mutated_real_errors())
def test_explain_answers_any_mutation_of_a_real_error_in_the_json_contract(
    error_file: Path, text: str
) -> None:
    assert_explains(error_file, text)


@fuzz(700)
@given(text=composed_errors)
def test_explain_answers_texts_made_of_error_words_and_odd_numbers(
    error_file: Path, text: str
) -> None:
    assert_explains(error_file, text)


@fuzz(700)
@given(text=any_text)
def test_explain_answers_any_text_at_all(error_file: Path, text: str) -> None:
    assert_explains(error_file, text)


@fuzz(200)
@given(data=st.binary(max_size=3000))
def test_explain_reads_any_bytes_without_a_traceback(error_file: Path, data: bytes) -> None:
    error_file.write_bytes(data)

    said = memdoc("explain", str(error_file))

    assert said.status in (0, 3)
    assert said.stdout.strip()


def test_explain_reads_a_17_mib_line(error_file: Path) -> None:
    assert_explains(error_file, "CUDA out of memory. " + "x" * (17 * 1024 * 1024))


@pytest.mark.parametrize(
    "stdin",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00\xff\xfe" * 1000, id="binary"),
        pytest.param(REAL_ERRORS[0].encode(), id="a-real-oom"),
        pytest.param(b"all good, no error here\n", id="no-error"),
        pytest.param(("Tried to allocate " + "9" * 5000 + " GiB\n").encode(), id="absurd-number"),
    ],
)
def test_the_real_cli_explains_stdin_without_a_traceback(stdin: bytes) -> None:
    done = subprocess.run(
        memdoc_cmd("explain", "-", "--json"), input=stdin, capture_output=True, timeout=60
    )

    assert done.returncode in (0, 3), done.stderr
    assert b"Traceback" not in done.stderr
    assert set(json.loads(done.stdout)) == {"oom", "findings"}
