"""The end-of-run summary: a short diagnosis when something went wrong, else one quiet line."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.text import Text

from memdoc.report.summary import diagnosis_lines, print_end_of_run
from memdoc.rules.base import Finding
from memdoc.rules.engine import diagnose_run
from memdoc.trace import load_run
from tests.report.traces import write_clean_h200_run, write_host_only_run, write_oom_run


def _findings(trace: Path) -> list[Finding]:
    return diagnose_run(load_run([trace]))


def _summary(paths: list[Path], report: Path | None = None) -> str:
    stream = io.StringIO()
    print_end_of_run(paths, stream, report_path=report)
    return stream.getvalue()


def test_a_clean_run_prints_one_quiet_line_with_peaks_and_the_trace(tmp_path: Path) -> None:
    trace = write_clean_h200_run(tmp_path / "run.memdoc", devices=2)

    out = _summary([trace])

    assert out.count("\n") == 1
    peaks = r"peak GPU 0 \d+\.\d GiB, GPU 1 \d+\.\d GiB, host 3\.\d GiB"
    assert re.fullmatch(rf"memdoc: {peaks} · trace {re.escape(str(trace))}\n", out), out


def test_the_quiet_line_names_the_report_when_one_was_written(tmp_path: Path) -> None:
    trace = write_clean_h200_run(tmp_path / "run.memdoc", devices=1)

    out = _summary([trace], report=tmp_path / "run.html")

    assert out.endswith(f" · report {tmp_path / 'run.html'}\n")


def test_an_oom_prints_the_ending_the_top_findings_their_fix_and_the_paths(tmp_path: Path) -> None:
    trace = write_oom_run(tmp_path / "run.memdoc")

    out = _summary([trace], report=tmp_path / "run.html")

    lines = out.splitlines()
    top = _findings(trace)[0]
    assert lines[0] == "memdoc: Ran out of GPU memory on GPU 0"
    assert "71.2 MiB were free" in lines[1]
    assert f"  1. {top.title} (strong, {round(top.confidence * 100)}%)" in lines
    assert f"     fix: {top.fixes[0].title}" in lines
    first_code_line = top.fixes[0].code.strip().splitlines()[0]
    assert f"       {first_code_line}" in lines
    assert f"  trace:  {trace}" in lines
    assert f"  report: {tmp_path / 'run.html'}" in lines
    assert len(lines) < 25, "short: the details are in diagnose and the report"


def test_a_killed_run_says_so_and_points_to_more(tmp_path: Path) -> None:
    trace = write_host_only_run(tmp_path / "run.memdoc")

    out = _summary([trace])

    assert out.startswith("memdoc: Killed by SIGKILL (signal 9)")
    assert "host-oom" in {f.rule for f in _findings(trace)}
    assert all(f"{f.title} (" in out for f in _findings(trace)[:3])
    assert f"memdoc diagnose {trace}" in out
    assert f"memdoc report {trace}" in out, "no report yet: say how to get one"


def test_an_unreadable_trace_gets_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "run.memdoc"
    junk.write_bytes(b"\x00garbage")

    out = _summary([junk])

    assert out.count("\n") == 1
    assert out.startswith(f"memdoc: trace {junk} cannot be read")


def test_weak_findings_are_named_not_hidden_behind_no_pattern_matched() -> None:
    # diagnose lists them and exits 3: the summary must not say nothing matched.
    weak = Finding("host-oom", "MD019", "The host ran out of memory", 0.2, "A host allocation.")
    first = Text("Ended by SIGKILL")

    weak_lines = [str(t) for t in diagnosis_lines(first, None, [weak], ["run.memdoc"], None)]
    none_lines = [str(t) for t in diagnosis_lines(first, None, [], ["run.memdoc"], None)]

    assert "  only weak signs of a memory problem: host-oom" in weak_lines
    assert not any("no known memory pattern" in line for line in weak_lines)
    assert "  no known memory pattern matched this run" in none_lines
