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

    assert result.returncode == 3, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"oom", "findings", "run"}
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
    out = json.loads(result.stdout)
    assert (out["oom"], out["findings"]) == (None, [])


def test_the_terminal_view_shows_the_ending_findings_ledger_and_steps(tmp_path: Path) -> None:
    write_oom_run(tmp_path / "run.memdoc")

    result = run_memdoc("diagnose", "run.memdoc", cwd=tmp_path, env={"COLUMNS": "120"})

    out = result.stdout.decode()
    assert result.returncode == 3, result.stderr
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


def test_json_says_how_long_the_run_took_its_peaks_steps_and_how_it_ended(
    tmp_path: Path,
) -> None:
    write_oom_run(tmp_path / "run.memdoc", steps=46)

    result = run_memdoc("diagnose", "run.memdoc", "--json", cwd=tmp_path)

    run = json.loads(result.stdout)["run"]
    assert run["duration_s"] > 0 and run["steps"] == 46
    (device,) = run["devices"]
    assert device["index"] == 0 and device["total_bytes"] == oom_1g().total_bytes
    assert 0 < device["peak_held_bytes"] <= device["total_bytes"]
    assert run["host"]["peak_rss_bytes"] is None or run["host"]["peak_rss_bytes"] > 0
    assert run["ended"] == {
        "kind": "oom",
        "text": run["ended"]["text"],
        "exit_code": 1,
        "signal": None,
        "status": 1,
        "oom": True,
    }


def test_json_of_a_clean_run_ends_with_exit_code_0_and_no_oom(tmp_path: Path) -> None:
    write_clean_h200_run(tmp_path / "run.memdoc", devices=2, steps=60)

    result = run_memdoc("diagnose", "run.memdoc", "--json", cwd=tmp_path)

    run = json.loads(result.stdout)["run"]
    assert [d["index"] for d in run["devices"]] == [0, 1] and run["steps"] == 60
    assert (run["ended"]["exit_code"], run["ended"]["oom"]) == (0, False)


def test_several_ranks_each_get_a_summary(tmp_path: Path) -> None:
    paths = write_rank_traces(tmp_path)

    result = run_memdoc("diagnose", *[p.name for p in paths], "--json", cwd=tmp_path)

    assert [r["rank"] for r in json.loads(result.stdout)["run"]["ranks"]] == [0, 1, 2, 3]


def test_help_documents_the_exit_status() -> None:
    result = run_memdoc("diagnose", "--help")

    assert b"3 memory problem found" in result.stdout and b"0 no memory problem" in result.stdout
