"""What a frame shows, computed without a terminal: the ledger, the chart, the rows, the text."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text

from benchmarks.demo_trace import (
    CONTEXT_BYTES,
    DEVICE_TOTAL_BYTES,
    DRIVER_BYTES,
    OTHER_BYTES,
    OTHER_PID,
)
from memdoc.trace import (
    SCHEMA_VERSION,
    Event,
    EventKind,
    ExitInfo,
    Header,
    Metric,
    OomInfo,
    SeriesKey,
    Trace,
    load_trace,
)
from memdoc.trace.ledger import Readings, build_ledger, ledger_at
from memdoc.tui.history import TICK_MARK, TICK_OOM, TICK_STEP, Window, device_chart, host_chart
from memdoc.tui.ledger import DeviceBar, Segment
from memdoc.tui.sources import KIND_FOLLOW, SourceState
from memdoc.tui.timeline import EventIndex
from memdoc.tui.view import StatusView, ViewRequest, build_view, host_at, process_rows
from memdoc.tui.widgets.chart import chart_text, render_chart
from memdoc.tui.widgets.header import header_lines
from memdoc.tui.widgets.ledger import bar_cells
from memdoc.tui.widgets.tabs import tabs_text
from memdoc.tui.widgets.text import pack
from memdoc.units import GiB

RANK0 = 4243


def _events(trace: Trace) -> EventIndex:
    events = EventIndex()
    events.update(trace)
    return events


def test_the_ledger_splits_the_device_into_six_layers_the_driver_remainder_shown(
    demo_trace: Path,
) -> None:
    trace = load_trace(demo_trace)
    bar = DeviceBar.of(ledger_at(trace, 0, 20.0))
    reserved = trace.series("torch.reserved", 0, RANK0).at(20.0)
    allocated = trace.series("torch.allocated", 0, RANK0).at(20.0)
    used = trace.series(Metric.GPU_USED, 0).at(20.0)
    sizes = {s.key: s.size_bytes for s in bar.segments()}
    assert sizes["allocated"] == allocated
    assert sizes["cached"] == reserved - allocated
    assert sizes["ours_other"] == CONTEXT_BYTES
    assert sizes["others"] == OTHER_BYTES
    # The driver's own reservation is in no process: the bar names it rather than hide it.
    assert sizes["unexplained"] == used - (reserved + CONTEXT_BYTES + OTHER_BYTES) == DRIVER_BYTES
    assert sizes["free"] == DEVICE_TOTAL_BYTES - used
    assert sum(v for v in sizes.values() if v) == DEVICE_TOTAL_BYTES
    assert list(sizes) == ["allocated", "cached", "ours_other", "others", "unexplained", "free"]
    # Between two samples nothing changes on screen, so the bar is not redrawn.
    assert DeviceBar.of(ledger_at(trace, 0, 20.001)) == bar


def _bar(readings: Readings) -> DeviceBar:
    return DeviceBar.of(build_ledger(0, "now", 1.0, readings))


def test_a_ledger_without_the_driver_view_leaves_those_layers_unknown() -> None:
    bar = _bar(Readings(allocated_bytes={"pytorch": 3 * GiB}, reserved_bytes={"pytorch": 5 * GiB}))
    sizes = {s.key: s.size_bytes for s in bar.segments()}
    assert sizes == {
        "allocated": 3 * GiB,
        "cached": 2 * GiB,
        "ours_other": None,
        "others": None,
        "free": None,
    }
    assert bar.capacity_bytes == 5 * GiB  # the bar is drawn against what is known
    assert bar.used_fraction is None


def test_a_fully_explained_device_draws_no_remainder() -> None:
    bar = _bar(
        Readings(
            total_bytes=24 * GiB,
            free_bytes=4 * GiB,
            this_process_bytes=12 * GiB,
            other_processes_bytes=8 * GiB,
        )
    )
    assert [(s.key, s.size_bytes) for s in bar.segments()] == [
        ("ours_other", 12 * GiB),
        ("others", 8 * GiB),
        ("free", 4 * GiB),
    ]
    assert bar.used_fraction == pytest.approx(20 / 24)


def test_a_system_view_calls_every_process_just_a_process() -> None:
    bar = _bar(
        Readings(
            total_bytes=24 * GiB,
            free_bytes=4 * GiB,
            other_processes_bytes=19 * GiB,
            run_known=False,
        )
    )
    assert [(s.label, s.size_bytes) for s in bar.segments()] == [
        ("processes", 19 * GiB),
        ("unexplained", 1 * GiB),
        ("free", 4 * GiB),
    ]


@pytest.mark.parametrize(
    ("sizes", "capacity", "width", "expected"),
    [
        pytest.param([50, 25, 25], 100, 20, [10, 5, 5], id="proportional"),
        pytest.param([3, 0, 997], 1000, 10, [1, 0, 9], id="a-sliver-stays-visible"),
        pytest.param([1, 0, 999], 1000, 10, [0, 0, 10], id="a-speck-is-not-drawn"),
        pytest.param([None, 30, 70], 100, 10, [0, 3, 7], id="unknown-gets-nothing"),
        pytest.param([0, 0, 0], None, 10, [0, 0, 0], id="nothing-known"),
    ],
)
def test_bar_cells_fill_the_width_in_proportion(
    sizes: list[int | None], capacity: int | None, width: int, expected: list[int]
) -> None:
    keys = ["allocated", "cached", "free"]
    segments = [Segment(k, k, s) for k, s in zip(keys, sizes, strict=True)]
    assert bar_cells(segments, capacity, width) == expected


def test_the_chart_keeps_a_spike_between_samples_as_the_peak_envelope(demo_trace: Path) -> None:
    trace = load_trace(demo_trace)
    # Every seventh sample of the demo carries a 1.5 GiB interval peak above its value.
    chart = device_chart(trace, _events(trace), 0, Window(0.0, 30.0, 300))
    above = [
        (p or 0) - (lv or 0) for p, lv in zip(chart.peak, chart.level, strict=True) if p and lv
    ]
    assert max(above) >= 1.4 * GiB
    assert all(p >= lv for p, lv in zip(chart.peak, chart.level, strict=True) if p and lv)
    assert chart.limit_bytes == DEVICE_TOTAL_BYTES
    assert chart.band_label == "reserved"


def test_the_chart_ticks_steps_marks_and_the_oom_and_the_oom_wins(demo_trace: Path) -> None:
    trace = load_trace(demo_trace)
    chart = device_chart(trace, _events(trace), 0, Window(0.0, 30.0, 60))
    assert chart.ticks.count(TICK_STEP) > 40
    assert chart.ticks.count(TICK_MARK) == 3  # train at 0 s, eval at 18 s, train at 21 s
    assert chart.ticks[-1] == TICK_OOM  # a step ended in the same column


def test_the_chart_shows_nothing_after_the_instant_shown(demo_trace: Path) -> None:
    trace = load_trace(demo_trace)
    chart = device_chart(trace, _events(trace), 0, Window(0.0, 30.0, 30, end_s=10.0))
    assert all(v is None for v in chart.level[11:])
    assert TICK_OOM not in chart.ticks
    assert chart.level[9] is not None


def test_without_a_gpu_the_chart_shows_host_memory() -> None:
    trace = Trace(Header(version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="test"))
    for t in range(10):
        trace.add_values(float(t), [(SeriesKey(Metric.HOST_RSS), (t + 1) * GiB)])
    trace.add_values(0.0, [(SeriesKey(Metric.HOST_TOTAL), 64 * GiB)])
    chart = host_chart(trace, EventIndex(), Window(0.0, 10.0, 10), host_at(trace, 9.0).limit_bytes)
    assert chart.level_label == "host RSS"
    assert chart.level[-1] == 10 * GiB
    assert chart.limit_bytes == 64 * GiB


def test_the_drawn_chart_labels_its_axis_and_marks_the_oom(demo_trace: Path) -> None:
    trace = load_trace(demo_trace)
    chart = device_chart(trace, _events(trace), 0, Window(0.0, 30.0, 80))
    text = chart_text(render_chart(chart, 90, 12, "whole run"))
    lines = text.splitlines()
    assert len(lines) == 12
    assert all(len(line) <= 90 for line in lines)
    assert "allocated" in lines[0] and "whole run" in lines[0]
    assert "GiB┤" in text
    assert lines[-2].endswith("✖")
    assert lines[-1].rstrip().endswith("30.0s")


def test_processes_on_a_device_list_ours_first_with_gpu_memory_and_rss(demo_trace: Path) -> None:
    trace = load_trace(demo_trace)
    rows = process_rows(trace, 0, 20.0)
    assert [r.pid for r in rows] == [RANK0, OTHER_PID]
    assert rows[0].ours and not rows[1].ours
    assert rows[1].gpu_bytes == OTHER_BYTES and rows[1].user == "alice"
    assert rows[0].rss_bytes is not None and "train.py" in rows[0].command
    assert [r.pid for r in process_rows(trace, 1, 20.0)] == [RANK0 + 1]


def test_a_frame_shows_nothing_recorded_after_its_instant(demo_trace: Path) -> None:
    trace = load_trace(demo_trace)
    state = SourceState(KIND_FOLLOW, "run.memdoc", trace, now_t=15.0)
    view = build_view(state, _events(trace), ViewRequest(device=1, columns=40), 0.0)
    assert view.device == 1
    assert view.oom is None and view.status.exit_text is None
    assert view.status.step == 30 and view.status.phase == "train"
    end = build_view(
        SourceState(KIND_FOLLOW, "run.memdoc", trace, now_t=trace.duration_s),
        _events(trace),
        ViewRequest(device=7, columns=40),  # no such device: the first is shown
        0.0,
    )
    assert end.device == 0
    assert end.oom is not None and end.oom.oom.requested_bytes == 4 * GiB
    assert end.status.exit_text == "exit code 1"


def test_eight_tabs_fit_sixty_columns() -> None:
    from memdoc.tui.view import DeviceTab

    tabs = tuple(DeviceTab(i, "H100 80GB HBM3", 0.1 * i) for i in range(8))
    text = tabs_text(tabs, 3, 58)
    assert text.cell_len <= 58
    assert all(f"{i}:" in text.plain for i in range(8))
    wide = tabs_text(tabs[:2], 0, 98)
    assert "H100 80GB HBM3" in wide.plain


def test_the_header_says_when_a_followed_trace_has_gone_quiet() -> None:
    status = StatusView(kind=KIND_FOLLOW, label="run.memdoc", command="", now_t=3.0, live=True)
    quiet = StatusView(**{**status.__dict__, "age_s": 12.0})
    assert "no new data" not in Text("\n").join(header_lines(status, 100)).plain
    assert "no new data for 12.0s" in Text("\n").join(header_lines(quiet, 100)).plain


def test_pack_keeps_items_whole_and_fills_lines() -> None:
    items = [Text("alpha 1"), Text("beta 22"), Text("gamma 333")]
    assert [line.plain for line in pack(items, 16)] == ["alpha 1  beta 22", "gamma 333"]
    assert [line.plain for line in pack(items, 200)] == ["alpha 1  beta 22  gamma 333"]


def _host_only(values: dict[SeriesKey, float]) -> Trace:
    trace = Trace(Header(version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="test", pid=10))
    for t in range(5):
        trace.add_values(float(t), list(values.items()))
    return trace


@pytest.mark.parametrize(
    ("limits", "capacity", "name", "sizes"),
    [
        pytest.param(
            {SeriesKey(Metric.CGROUP_LIMIT): 8 * GiB, SeriesKey(Metric.CGROUP_USAGE): 6 * GiB},
            8 * GiB,
            "cgroup limit",
            [4 * GiB, 2 * GiB, 2 * GiB],
            id="cgroup",
        ),
        pytest.param(
            {
                SeriesKey(Metric.HOST_RLIMIT_AS, pid=10): 5 * GiB,
                SeriesKey(Metric.HOST_VMS, pid=10): 4.5 * GiB,
            },
            5 * GiB,
            "address-space cap",
            [4 * GiB, 0.5 * GiB, 0.5 * GiB],
            id="rlimit-as",
        ),
        pytest.param({}, 64 * GiB, "RAM", [4 * GiB, 16 * GiB, 44 * GiB], id="ram"),
    ],
)
def test_without_a_gpu_the_host_bar_and_chart_are_drawn_against_the_tightest_limit(
    limits: dict[SeriesKey, float], capacity: int, name: str, sizes: list[float]
) -> None:
    # GIVEN a run of 4 GiB resident on a 64 GiB machine with 44 GiB available
    trace = _host_only(
        {
            SeriesKey(Metric.HOST_RSS): 4 * GiB,
            SeriesKey(Metric.HOST_TOTAL): 64 * GiB,
            SeriesKey(Metric.HOST_AVAILABLE): 44 * GiB,
            **limits,
        }
    )
    state = SourceState(KIND_FOLLOW, "run.memdoc", trace, now_t=4.0)

    view = build_view(state, _events(trace), ViewRequest(columns=40), 0.0)

    assert view.ledger is not None and view.chart is not None
    assert view.ledger.capacity_bytes == capacity
    assert view.ledger.limit_name == name  # type: ignore[union-attr]
    assert [s.size_bytes for s in view.ledger.segments()] == sizes
    assert view.chart.limit_bytes == capacity


def test_an_oom_of_a_run_that_then_exited_0_is_shown_as_caught() -> None:
    trace = _host_only({SeriesKey(Metric.HOST_RSS): 1 * GiB})
    oom = OomInfo(framework="host", kind="host-alloc", message="MemoryError")
    trace.add_event(Event(2.0, EventKind.OOM, None, {"oom": oom.to_dict()}))
    trace.exit = ExitInfo(t=4.0, exit_code=0)

    def shown_at(now: float) -> bool | None:
        state = SourceState(KIND_FOLLOW, "run.memdoc", trace, now_t=now)
        view = build_view(state, _events(trace), ViewRequest(columns=40), 0.0)
        return view.oom.handled if view.oom is not None else None

    assert shown_at(3.0) is False  # nothing says yet that the program went on
    assert shown_at(4.0) is True
