"""`memdoc diagnose`: the reason and the fix in the terminal, or the JSON contract for tools."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_memdoc
from tests.report.traces import oom_1g, write_clean_h200_run, write_oom_run, write_rank_traces


def test_json_prints_the_contract_with_the_ending_oom_and_findings_best_first(
    tmp_path: Path,
) -> None:
    write_oom_run(tmp_path / "run.memdoc")

    result = run_memdoc("diagnose", "run.memdoc", "--json", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"oom", "findings"}
    assert out["oom"] == oom_1g().to_dict()
    assert out["findings"], "the leak and the other process are found"
    confidences = [f["confidence"] for f in out["findings"]]
    assert confidences == sorted(confidences, reverse=True)
    for finding in out["findings"]:
        assert {"rule", "code", "title", "confidence", "evidence", "fixes"} <= set(finding)
        assert 0.0 <= finding["confidence"] <= 1.0


def test_json_of_a_clean_run_has_no_oom_and_no_findings(tmp_path: Path) -> None:
    write_clean_h200_run(tmp_path / "run.memdoc", devices=1)

    result = run_memdoc("diagnose", "run.memdoc", "--json", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"oom": None, "findings": []}


def test_the_terminal_view_shows_the_ending_findings_ledger_and_steps(tmp_path: Path) -> None:
    write_oom_run(tmp_path / "run.memdoc")

    result = run_memdoc("diagnose", "run.memdoc", cwd=tmp_path, env={"COLUMNS": "120"})

    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr
    assert "Ran out of GPU memory on GPU 0" in out
    assert "Why, and what to change" in out
    assert "Where the memory went" in out and "13.64 GiB" in out and "71.25 MiB" in out
    assert "Per step" in out


def test_several_ranks_are_diagnosed_as_one_run(tmp_path: Path) -> None:
    paths = write_rank_traces(tmp_path)

    result = run_memdoc("diagnose", *[p.name for p in paths], "--json", cwd=tmp_path)

    out = json.loads(result.stdout)
    assert out["oom"]["device"] == 2, "the OOM of the rank that failed first"


def test_a_file_that_is_not_a_trace_gets_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("just some notes\n")

    result = run_memdoc("diagnose", "notes.txt", cwd=tmp_path)

    assert result.returncode == 2
    errors = [line for line in result.stderr.decode().splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr.decode()
    assert result.stdout == b""
