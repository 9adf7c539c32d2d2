"""The terminal report renders the same computed data as the HTML, so the two never disagree."""

from __future__ import annotations

import html
import io
from pathlib import Path

import pytest
from rich.console import Console

from memdoc.report.data import ReportData
from memdoc.report.html import render_data
from memdoc.report.terminal import render_terminal, sparkline
from memdoc.rules.engine import diagnose_run
from memdoc.trace import load_run
from memdoc.units import format_bytes
from tests.report.traces import write_host_only_run, write_oom_run, write_rank_traces


def _both(paths: list[Path]) -> tuple[ReportData, str, str]:
    run = load_run(paths)
    data = ReportData.from_run(run, diagnose_run(run))
    out = io.StringIO()
    render_terminal(data, Console(file=out, width=160, color_system=None))
    return data, out.getvalue(), html.unescape(render_data(data))


def test_terminal_and_html_show_the_same_ledger_numbers_and_findings(tmp_path: Path) -> None:
    data, text, page = _both([write_oom_run(tmp_path / "run.memdoc")])

    assert data.overview.ending.text in text and data.overview.ending.text in page
    assert data.oom is not None and data.oom.words[:60] in text.replace("\n", " ")
    for ledger in data.ledgers:
        for term in ledger.terms:
            shown = format_bytes(term.bytes, 2)
            assert shown in text and shown in page, term
    for finding in data.findings:
        assert finding.title in text and finding.title in page
        assert finding.fixes[0].code.strip().splitlines()[0] in text


def test_terminal_lists_ranks_and_the_one_that_failed_first(tmp_path: Path) -> None:
    _, text, _ = _both(write_rank_traces(tmp_path))

    assert "rank 2  failed first" in text
    assert text.count("Ended by SIGTERM") == 3


def test_a_host_only_run_has_a_per_step_line_and_no_ledger(tmp_path: Path) -> None:
    _, text, _ = _both([write_host_only_run(tmp_path / "run.memdoc")])

    assert "Where the memory went" not in text
    assert "host RSS of the process tree" in text
    assert "+160.0 MiB/step" in text


def test_the_host_peak_is_shown_against_the_limit_that_bound_the_run(tmp_path: Path) -> None:
    # GIVEN a run in a cgroup limited to 8 GiB
    data, text, page = _both([write_host_only_run(tmp_path / "run.memdoc")])

    assert data.overview.host_peak_rss_bytes is not None
    peak = format_bytes(data.overview.host_peak_rss_bytes)
    assert f"{peak} of the 8.0 GiB cgroup limit" in text
    assert f"{peak} (of the 8.0 GiB cgroup limit)" in page


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([1.0, 2.0, 3.0, 4.0], "▁▃▆█", id="rising"),
        pytest.param([5.0, 5.0], "▁▁", id="flat"),
        pytest.param([], "", id="empty"),
    ],
)
def test_sparkline_draws_the_shape_of_a_curve(values: list[float], expected: str) -> None:
    assert sparkline(values) == expected


def test_sparkline_squeezes_long_curves_keeping_each_chunks_peak() -> None:
    values = [0.0] * 100
    values[57] = 9.0

    line = sparkline(values, width=10)

    assert len(line) == 10
    assert line == "▁▁▁▁▁█▁▁▁▁"
