"""`memdoc explain`: from an error text to the reason and the fix, as a user runs it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memdoc.cli.main import main
from tests.conftest import run_memdoc
from tests.rules.fixture_cases import GOLDEN, RULE_FIXTURES

SGLANG = RULE_FIXTURES / "fragmentation" / "miss-cache-smaller-than-request.txt"
CROSSFIT = RULE_FIXTURES / "fragmentation" / "hit-reserved-unallocated.txt"
NOT_MEMORY = (
    b"Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\nKeyError: 'lr'\n"
)

# What the user sees for a handful of real messages, reviewed once and kept.
GOLDEN_INPUTS = {
    "pytorch-activations": SGLANG,
    "pytorch-fragmentation": CROSSFIT,
    "pytorch-other-process": RULE_FIXTURES / "other-process" / "hit-unaccounted-memory.txt",
    "tensorflow-shape": RULE_FIXTURES / "activations-too-large" / "hit-batch-too-large-tf.txt",
    "tensorflow-disguised-cudnn": RULE_FIXTURES
    / "framework-preallocation"
    / "hit-convolution-algorithm.txt",
    "jax-buffer-assignment": RULE_FIXTURES / "xla-temp-buffers" / "hit-buffer-assignment.txt",
    "dataloader-killed": RULE_FIXTURES / "host-oom" / "hit-dataloader-killed.txt",
    "vllm-kv-cache": RULE_FIXTURES / "memory-fraction-cap" / "hit-vllm-kv-cache.txt",
}


def test_explain_reads_the_error_from_stdin() -> None:
    result = run_memdoc("explain", input=SGLANG.read_bytes())

    out = result.stdout.decode()
    assert result.returncode == 3, result.stderr
    assert out.startswith("PyTorch: out of memory on GPU 0\n")
    assert "Of 15.6 GiB on GPU 0, 71.2 MiB were free" in out
    assert "activations-too-large" in out


def test_explain_reads_a_log_file_and_puts_the_best_finding_first() -> None:
    result = run_memdoc("explain", str(CROSSFIT))

    out = result.stdout.decode()
    assert result.returncode == 3, result.stderr
    why = out.split("Why, and what to change", 1)[1]
    assert why.lstrip().startswith("1. Free memory is cached in the pool but not in one piece")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in why


def test_explain_json_prints_the_contract() -> None:
    result = run_memdoc("explain", str(CROSSFIT), "--json")

    data = json.loads(result.stdout)
    assert result.returncode == 3
    assert data["oom"]["framework"] == "pytorch"
    used = round(36.53 * 1024**3)  # "Process 445260 has 36.53 GiB memory in use"
    assert data["oom"]["processes"] == [{"pid": 445260, "used_bytes": used, "this_process": False}]
    assert [f["rule"] for f in data["findings"]][0] == "fragmentation"


@pytest.mark.parametrize("as_json", [pytest.param(False, id="text"), pytest.param(True, id="json")])
def test_a_text_without_a_memory_error_says_so_and_exits_0(as_json: bool) -> None:
    result = run_memdoc("explain", *(["--json"] if as_json else []), input=NOT_MEMORY)

    assert result.returncode == 0
    if as_json:
        assert json.loads(result.stdout) == {"oom": None, "findings": []}
    else:
        assert result.stdout.decode() == "No memory error found in this text.\n"


@pytest.mark.parametrize(
    ("make_arg", "message"),
    [
        pytest.param(lambda d: str(d / "missing.log"), "no such file", id="missing-file"),
        pytest.param(lambda d: str(d), "is a folder", id="folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, make_arg, message: str) -> None:  # type: ignore[no-untyped-def]
    result = run_memdoc("explain", make_arg(tmp_path))

    err = result.stderr.decode()
    assert result.returncode == 2
    assert err.startswith("memdoc: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_trace_given_to_explain_points_to_diagnose() -> None:
    trace = RULE_FIXTURES / "host-oom" / "hit-sigkill-near-limit.memdoc"

    result = run_memdoc("explain", str(trace))

    assert result.returncode == 2
    assert f"hint: memdoc diagnose {trace}" in result.stderr.decode()


def test_binary_garbage_is_read_without_a_traceback() -> None:
    result = run_memdoc("explain", input=bytes(range(256)) * 64)

    assert result.returncode == 0 and b"Traceback" not in result.stderr
    assert result.stdout.decode() == "No memory error found in this text.\n"


@pytest.mark.parametrize("name", sorted(GOLDEN_INPUTS))
def test_explain_output_matches_its_reviewed_golden(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "88")
    monkeypatch.delenv("FORCE_COLOR", raising=False)

    assert main(["explain", str(GOLDEN_INPUTS[name])]) == 3

    out = capsys.readouterr().out
    golden = GOLDEN / f"explain-{name}.txt"
    if os.environ.get("MEMDOC_UPDATE_GOLDEN"):
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("text", "status"),
    [
        pytest.param(b"RuntimeError: CUDA error: out of memory\n", 3, id="memory-error-3"),
        pytest.param(b"ValueError: shapes (3,) and (4,) not aligned\n", 0, id="no-memory-error-0"),
    ],
)
def test_the_exit_status_says_whether_a_memory_problem_was_found(text: bytes, status: int) -> None:
    for extra in ([], ["--json"]):
        assert run_memdoc("explain", *extra, input=text).returncode == status


def test_help_documents_the_exit_status() -> None:
    result = run_memdoc("explain", "--help")

    out = result.stdout.decode()
    assert result.returncode == 0
    assert "0 no memory problem found" in out and "3 memory problem found" in out
    assert "1 memdoc itself failed" in out and "2 usage error" in out


def test_a_failure_inside_memdoc_is_one_line_and_status_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The only stand-in here: a rule engine that breaks, to see how the command fails.
    def broken(text: str) -> None:
        raise RuntimeError("rule engine broke")

    monkeypatch.setattr("memdoc.rules.engine.explain_text", broken)
    log = tmp_path / "crash.log"
    log.write_text("RuntimeError: CUDA error: out of memory\n")

    status = main(["explain", str(log)])

    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("memdoc: error: memdoc failed (RuntimeError: rule engine broke)")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "first_line"),
    [
        pytest.param(
            b"MemoryError: std::bad_alloc: out_of_memory: RMM failure at:/opt/conda/include/rmm/"
            b"mr/device/pool_memory_resource.hpp:196: Maximum pool size exceeded\n",
            "RAPIDS' memory pool (RMM) could not allocate",
            id="rmm-no-framework",
        ),
        pytest.param(
            b"F0102 10:00:00.000000  4242 syncedmem.cpp:56] Check failed: error == cudaSuccess "
            b"(2 vs. 0)  out of memory\n",
            "Caffe: a CUDA call ran out of memory",
            id="caffe",
        ),
    ],
)
def test_the_headline_names_what_failed_and_starts_a_sentence(text: bytes, first_line: str) -> None:
    result = run_memdoc("explain", input=text)

    assert result.returncode == 3, result.stderr
    assert result.stdout.decode().splitlines()[0] == first_line


def test_a_framework_memdoc_does_not_watch_gets_no_other_frameworks_code() -> None:
    text = (
        b"F0102 10:00:00.000000  4242 syncedmem.cpp:56] Check failed: error == cudaSuccess "
        b"(2 vs. 0)  out of memory\n"
    )

    result = run_memdoc("explain", "--json", input=text)

    findings = json.loads(result.stdout)["findings"]
    assert findings
    fixes = [fix for finding in findings for fix in finding["fixes"]]
    assert fixes  # "See who holds the GPU" and the like
    assert all(fix["framework"] == "any" for fix in fixes), fixes


OOM_AT_THE_END = (
    b"Traceback (most recent call last):\n"
    b'  File "train.py", line 9, in <module>\n'
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
    b"total capacity of 15.58 GiB of which 7.25 MiB is free.\n"
)


@pytest.mark.parametrize("via", ["file", "stdin"])
def test_the_line_of_an_error_is_the_line_of_the_whole_log_beyond_what_is_read(
    tmp_path: Path, via: str
) -> None:
    # GIVEN a log of 200,000 lines (4.7 MB, past the 1 MiB explain reads) ending in an OOM
    steps = b"".join(b"step %d loss 0.8360\n" % i for i in range(200_000))
    log = tmp_path / "big.log"
    log.write_bytes(steps + OOM_AT_THE_END)

    if via == "file":
        done = run_memdoc("explain", "--json", str(log))
    else:
        done = run_memdoc("explain", "--json", "-", input=log.read_bytes())

    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout)["oom"]["line"] == 200_003


def test_the_line_is_left_out_when_counting_it_would_read_too_much(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with open(log, "wb") as stream:
        stream.truncate(300 * 1024 * 1024)  # sparse, past what is counted
        stream.seek(300 * 1024 * 1024)
        stream.write(b"\n" + OOM_AT_THE_END)

    done = run_memdoc("explain", "--json", str(log))

    assert done.returncode == 3, done.stderr
    assert "line" not in json.loads(done.stdout)["oom"]
