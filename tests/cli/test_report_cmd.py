"""`memdoc report`: one HTML file, never an overwrite by surprise, never a partial file."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import run_memdoc
from tests.report.traces import SNAPSHOT, write_oom_run, write_rank_traces


def _stderr_lines(result: object) -> list[str]:
    return result.stderr.decode().splitlines()  # type: ignore[attr-defined,no-any-return]


def test_report_writes_the_html_beside_the_trace(tmp_path: Path) -> None:
    write_oom_run(tmp_path / "run.memdoc")

    result = run_memdoc("report", "run.memdoc", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "memdoc: report written to run.html\n"
    page = (tmp_path / "run.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Ran out of GPU memory on GPU 0" in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "run.memdoc"]


def test_report_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    write_oom_run(tmp_path / "run.memdoc")
    (tmp_path / "run.html").write_text("mine")

    refused = run_memdoc("report", "run.memdoc", cwd=tmp_path)

    assert refused.returncode == 2
    errors = [line for line in _stderr_lines(refused) if "error:" in line]
    assert errors == ["memdoc: error: run.html exists; not overwriting it"]
    assert "Traceback" not in refused.stderr.decode()
    assert (tmp_path / "run.html").read_text() == "mine"

    forced = run_memdoc("report", "run.memdoc", "--force", cwd=tmp_path)

    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "run.html").read_text().startswith("<!DOCTYPE html>")


def test_a_file_that_is_not_a_trace_gets_one_line_and_no_output(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("just some notes\n")

    result = run_memdoc("report", "notes.txt", "-o", "out.html", cwd=tmp_path)

    assert result.returncode == 2
    lines = _stderr_lines(result)
    assert len([line for line in lines if line.startswith("memdoc: error:")]) == 1
    assert "Traceback" not in result.stderr.decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"], "no partial output"


def test_report_never_writes_over_its_input(tmp_path: Path) -> None:
    write_oom_run(tmp_path / "run.memdoc")

    result = run_memdoc("report", "run.memdoc", "-o", "run.memdoc", "--force", cwd=tmp_path)

    assert result.returncode == 2
    assert "is one of the inputs" in result.stderr.decode()
    assert (tmp_path / "run.memdoc").read_bytes().startswith(b'{"type":"header"')


def test_several_rank_traces_make_one_report_with_a_ranks_section(tmp_path: Path) -> None:
    paths = write_rank_traces(tmp_path)

    result = run_memdoc("report", *[p.name for p in paths], "-o", "job.html", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    page = (tmp_path / "job.html").read_text()
    assert '<section id="ranks">' in page
    assert "failed first" in page


def test_a_pytorch_snapshot_alone_makes_a_report_with_its_allocation_sites(tmp_path: Path) -> None:
    shutil.copy(SNAPSHOT, tmp_path / "oom_snapshot.pickle")

    result = run_memdoc("report", "oom_snapshot.pickle", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    page = (tmp_path / "oom_snapshot.html").read_text()
    assert '<section id="allocations">' in page
    assert "<title>memdoc · oom_snapshot.pickle</title>" in page
