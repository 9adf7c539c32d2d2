"""`memdoc compare BASE NEW`: the exit status a CI job reads (0 within budget, 3 over, 2 an
input it cannot use), the three views, folders and baselines as inputs, and --save."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.cli.main import main
from tests.budget.runs import BASES, LEAKS, recorded
from tests.conftest import run_memdoc


def compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`memdoc compare ARGS` in this process: its status, stdout and stderr."""
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def fixture(name: str) -> str:
    return str(recorded(name))


def assert_one_line_error(err: str, *words: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("memdoc: error: ") and lines[1].startswith("memdoc: hint: ")
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], err


# -- budgets -------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", sorted(LEAKS))
def test_a_leak_fails_five_percent_on_its_growth_with_status_3(
    framework: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = compare(
        capsys, fixture(BASES[framework]), fixture(LEAKS[framework]), "--fail-over", "5%"
    )

    assert code == 3, out
    assert re.search(r"^growth per step .* over: adds [\d.]+ MiB over \d+ steps > ", out, re.M)
    assert out.rstrip().splitlines()[-1].startswith("over budget: ")


def test_wider_activations_fail_a_peak_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = compare(
        capsys,
        fixture("torch-base"),
        fixture("torch-wider"),
        "--fail-over",
        "peak_used=5%",
        "--fail-over",
        "step_peak=5%",
    )

    assert code == 3
    assert re.search(r"^peak used .* over: \+6\.\d% > 5%$", out, re.M)
    assert re.search(r"^highest per-step peak .* over: \+6\.\d% > 5%$", out, re.M)
    assert out.rstrip().splitlines()[-1] == "over budget: 2 figures"


def test_two_runs_of_one_program_pass_five_percent(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = compare(
        capsys, fixture("torch-base"), fixture("torch-base-again"), "--fail-over", "5%"
    )

    assert code == 0, out
    assert out.rstrip().splitlines()[-1] == "within budget"


def test_without_a_budget_a_leak_is_shown_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = compare(capsys, fixture("torch-base"), fixture("torch-leak"))

    assert code == 0
    assert "leak-across-steps" in out
    assert out.rstrip().splitlines()[-1] == "no budget given"


def test_different_programs_are_refused_unless_any_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = compare(capsys, fixture("torch-base"), fixture("keras-base"))

    assert code == 2 and out == ""
    assert_one_line_error(err, "different programs", "torch_train.py", "keras_fit.py")
    assert "--any-program" in err.splitlines()[1]

    code, out, _ = compare(
        capsys, fixture("torch-base"), fixture("keras-base"), "--any-program", "--fail-over", "1%"
    )

    assert code == 3, "keras's run needs more host memory"
    assert "memdoc compare · torch_train.py and keras_fit.py" in out


# -- views ---------------------------------------------------------------------------------


def test_json_is_one_object_of_both_runs_rows_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = compare(
        capsys, fixture("torch-base"), fixture("torch-leak"), "--fail-over", "5%", "--json"
    )

    data = json.loads(out)
    assert code == 3
    assert {"base", "new", "rows", "appeared", "gone", "notes", "over_budget"} <= set(data)
    assert data["over_budget"] is True
    assert data["base"]["program"] == data["new"]["program"] == "torch_train.py"
    assert [r["figure"] for r in data["rows"]] == [
        "peak_held",
        "peak_used",
        "step_peak",
        "growth_per_step",
        "peak_step",
    ]
    row = data["rows"][1]
    assert set(row) >= {"place", "figure", "base", "new", "change", "change_share", "allowed"}
    assert row["place"] == "host" and row["change"] == row["new"] - row["base"]
    assert [f["rule"] for f in data["appeared"]] == ["leak-across-steps"]


def test_markdown_is_a_table_for_a_pull_request_without_ansi(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = compare(
        capsys, fixture("keras-base"), fixture("keras-leak"), "--fail-over", "5%", "--markdown"
    )

    assert code == 3
    lines = out.splitlines()
    assert lines[0].startswith("### memdoc compare: keras_fit.py: over budget")
    assert "| place | figure | base | new | change | budget |" in lines
    assert any(line.startswith("| host | growth per step |") and "**over" in line for line in lines)
    assert "\x1b" not in out and all(line.isprintable() for line in lines)


def test_json_and_markdown_together_are_a_usage_error() -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["compare", "a", "b", "--json", "--markdown"])
    assert stopped.value.code == 2


# -- inputs: folders and baselines ---------------------------------------------------------


def test_a_run_folder_is_read_as_its_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(recorded("torch-leak"), folder / "vm-0-123.memdoc.gz")

    code, out, _ = compare(capsys, fixture("torch-base"), str(folder), "--fail-over", "5%")

    assert code == 3
    assert re.search(r"^new\s+\S*run\s+30 steps, ended ok$", out, re.M)


def test_a_saved_baseline_compares_as_its_trace_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"

    code, out, _ = compare(capsys, "--save", str(baseline), fixture("torch-base"))

    assert code == 0 and str(baseline) in out
    assert json.loads(baseline.read_text())["memdoc_baseline"] == 1
    budget = ("--fail-over", "5%", "--fail-over", "peak_held=64MiB", "--json")
    _, from_trace, _ = compare(capsys, fixture("torch-base"), fixture("torch-leak"), *budget)
    code, from_baseline, _ = compare(capsys, str(baseline), fixture("torch-leak"), *budget)

    assert code == 3
    rows_trace, rows_baseline = json.loads(from_trace)["rows"], json.loads(from_baseline)["rows"]
    assert len(rows_trace) == len(rows_baseline)
    for a, b in zip(rows_trace, rows_baseline, strict=True):
        # Saved figures are whole bytes: a growth rate may move by a fraction of a byte.
        for key in ("base", "new", "change", "allowed"):
            assert a[key] == pytest.approx(b[key], abs=1), (a, b)
        for key in ("place", "figure", "over", "why", "limit"):
            assert a[key] == b[key]


def test_save_with_two_runs_keeps_the_new_ones_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "new.json"

    code, _, _ = compare(
        capsys, fixture("torch-base"), fixture("torch-wider"), "--save", str(saved)
    )

    assert code == 0
    data = json.loads(saved.read_text())
    assert data["places"]["host"]["figures"]["peak_used"] > 650 << 20, "the wider run's peak"
    assert not list(tmp_path.glob(".*.tmp")), "written whole, nothing left beside it"


def test_save_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "baseline.json"
    saved.write_text("keep me")

    code, _, err = compare(capsys, "--save", str(saved), fixture("torch-base"))

    assert code == 2 and saved.read_text() == "keep me"
    assert_one_line_error(err, "exists")
    assert "--force" in err

    code, _, _ = compare(capsys, "--save", str(saved), "--force", fixture("torch-base"))

    assert code == 0 and json.loads(saved.read_text())["program"] == "torch_train.py"


# -- inputs it cannot use: one line, status 2 ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("missing.memdoc", None, "no such file"),
        ("empty.memdoc", b"", "empty"),
        ("random.bin", bytes(range(256)) * 8, "not a file memdoc can read"),
        ("other.json", b'{"name": "not a baseline", "peak": 1}', "not a memdoc baseline"),
        ("future.json", b'{"memdoc_baseline": 7, "places": {}}', "format 7"),
        ("list.json", b"[1, 2, 3]", "not a file memdoc can read"),
    ],
)
def test_an_input_it_cannot_use_is_one_line_and_status_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: bytes | None,
    words: str,
) -> None:
    bad = tmp_path / name
    if content is not None:
        bad.write_bytes(content)

    for args in ((str(bad), fixture("torch-base")), (fixture("torch-base"), str(bad))):
        code, out, err = compare(capsys, *args, "--fail-over", "5%")

        assert code == 2 and out == ""
        assert_one_line_error(err, name, words)


@pytest.mark.parametrize("spec", ["5x", "bogus=5%", "-1%", "peak_step=1%"])
def test_a_bad_budget_is_a_usage_error(capsys: pytest.CaptureFixture[str], spec: str) -> None:
    code, out, err = compare(capsys, "a.memdoc", "b.memdoc", f"--fail-over={spec}")

    assert code == 2 and out == ""
    assert_one_line_error(err, "--fail-over")


def test_one_run_without_save_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = compare(capsys, fixture("torch-base"))

    assert code == 2
    assert_one_line_error(err, "two runs")


# -- as a user runs it ---------------------------------------------------------------------


def test_the_command_compares_a_leak_in_a_process_of_its_own() -> None:
    result = run_memdoc(
        "compare", fixture("jax-base"), fixture("jax-leak"), "--fail-over", "growth_per_step=0"
    )

    out = result.stdout.decode()
    assert result.returncode == 3, result.stderr
    assert re.search(r"^growth per step .* over: adds [\d.]+ MiB over 29 steps > 0 B$", out, re.M)
    assert "\x1b" not in out, "piped: no colour"


def test_random_bytes_end_in_one_line_in_a_process_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "noise.memdoc").write_bytes(bytes(range(256)) * 64)

    result = run_memdoc("compare", "noise.memdoc", fixture("torch-base"), cwd=tmp_path)

    assert result.returncode == 2
    assert result.stdout == b""
    assert_one_line_error(result.stderr.decode(), "noise.memdoc")


def test_the_parser_loads_no_report_rules_or_rich() -> None:
    probe = (
        "import sys\n"
        "from memdoc.cli.main import build_parser\n"
        "build_parser()\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True)

    loaded = done.stdout.decode().split()
    heavy = ("rich", "memdoc.budget", "memdoc.rules", "memdoc.report", "memdoc.trace.reader")
    assert [m for m in loaded if m.split(".")[0] in heavy or m.startswith(heavy)] == []
