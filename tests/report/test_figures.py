"""The figures handed to plotly.js: shared time axis, exact values on hover, honest bars."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.report.data import ReportData
from memdoc.report.figures import ledger_figure, steps_figure
from memdoc.report.timeline_figure import timeline_figure
from memdoc.rules.engine import diagnose_run
from memdoc.trace import load_run
from memdoc.units import format_bytes
from tests.report.traces import write_clean_h200_run, write_oom_run


@pytest.fixture(scope="module")
def oom_data(tmp_path_factory: pytest.TempPathFactory) -> ReportData:
    run = load_run([write_oom_run(tmp_path_factory.mktemp("oom") / "run.memdoc")])
    return ReportData.from_run(run, diagnose_run(run))


def test_every_timeline_row_shares_one_zoomable_time_axis(tmp_path: Path) -> None:
    run = load_run([write_clean_h200_run(tmp_path / "run.memdoc", devices=2)])
    data = ReportData.from_run(run, [])

    figure = timeline_figure(data.timeline)

    assert figure is not None
    assert {trace["xaxis"] for trace in figure["data"]} == {"x"}
    assert {trace["yaxis"] for trace in figure["data"]} == {"y", "y2", "y3"}, "2 GPUs + host"
    assert figure["layout"]["xaxis"]["rangeslider"]["visible"] is True


def test_hover_shows_exact_values_in_human_units(oom_data: ReportData) -> None:
    figure = timeline_figure(oom_data.timeline)
    assert figure is not None

    for trace, line in zip(
        figure["data"], [ln for p in oom_data.timeline.panels for ln in p.lines], strict=True
    ):
        assert trace["customdata"] == [format_bytes(v, 2) for v in line.values_bytes]
        assert "%{customdata}" in trace["hovertemplate"]


def test_the_oom_is_a_red_line_on_the_timeline(oom_data: ReportData) -> None:
    figure = timeline_figure(oom_data.timeline)
    assert figure is not None and oom_data.oom is not None

    red = [s for s in figure["layout"]["shapes"] if s["line"]["color"] == "#dc2626"]

    assert any(s["x0"] == oom_data.oom.t for s in red)
    assert any(a["text"] == "OOM" for a in figure["layout"]["annotations"])


def test_ledger_bars_stack_to_the_device_total(oom_data: ReportData) -> None:
    figure = ledger_figure(oom_data.ledgers)
    assert figure is not None

    for row, ledger in enumerate(oom_data.ledgers):
        stacked_gib = sum(trace["x"][row] or 0.0 for trace in figure["data"])
        assert ledger.total_bytes is not None
        assert stacked_gib == pytest.approx(ledger.total_bytes / 1024**3, abs=0.001)


def test_the_per_step_figure_starts_before_step_one(oom_data: ReportData) -> None:
    figure = steps_figure(oom_data.steps)
    assert figure is not None

    baseline = next(t for t in figure["data"] if t["name"] == "baseline after the step")

    assert baseline["x"][:2] == [0.0, 1.0], "the value before step 1 shows the first jump"
