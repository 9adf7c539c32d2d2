"""The three sources: a replay driven by its clock, a followed file, and this machine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memdoc.collectors.nvml_gate import NvmlUnavailable, open_gate
from memdoc.trace import Metric, load_trace
from memdoc.trace.ledger import FREE
from memdoc.tui.feed import Feed
from memdoc.tui.ledger import DeviceBar
from memdoc.tui.sources import SPEEDS, ReplaySource, Seekable, TraceFollowSource
from memdoc.tui.system import SystemSource
from memdoc.tui.view import ViewRequest
from tests.collectors.nvml_standin import gate_from_nvidia_smi_xml
from tests.tui.conftest import FINDINGS, ManualClock, no_rules

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MiB = 1024**2


def test_a_replay_moves_with_its_clock_at_its_speed(demo_trace: Path) -> None:
    clock = ManualClock()
    source = ReplaySource(load_trace(demo_trace), clock=clock)
    assert source.poll().now_t == 0.0
    clock.advance(2.0)
    assert source.poll().now_t == pytest.approx(2.0)
    source.set_speed(4.0)
    clock.advance(1.0)
    assert source.poll().now_t == pytest.approx(6.0)


def test_a_paused_replay_stands_still_and_resumes_where_it_stood(demo_trace: Path) -> None:
    clock = ManualClock()
    source = ReplaySource(load_trace(demo_trace), clock=clock, start_s=5.0)
    source.set_paused(True)
    clock.advance(10.0)
    state = source.poll()
    assert state.paused and state.now_t == pytest.approx(5.0)
    source.set_paused(False)
    clock.advance(1.0)
    assert source.poll().now_t == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([1], 2.0, id="faster"),
        pytest.param([-1], 0.5, id="slower"),
        pytest.param([1] * 10, max(SPEEDS), id="at-most-16x"),
        pytest.param([-1] * 10, min(SPEEDS), id="at-least-half"),
    ],
)
def test_speed_steps_through_the_offered_speeds(
    demo_trace: Path, steps: list[int], expected: float
) -> None:
    source = ReplaySource(load_trace(demo_trace))
    for step in steps:
        source.change_speed(step)
    assert source.speed == expected


def test_seeking_is_clamped_to_the_run_and_the_end_pauses(demo_trace: Path) -> None:
    clock = ManualClock()
    source = ReplaySource(load_trace(demo_trace), clock=clock, start_s=10.0)
    source.seek_by(-60.0)
    assert source.poll().now_t == 0.0
    source.seek_to(1e9)
    state = source.poll()
    assert state.now_t == pytest.approx(source.end_t) and state.paused
    source.set_paused(False)  # play again from the end: start over
    assert source.poll().now_t == 0.0
    assert isinstance(source, Seekable)
    assert not isinstance(TraceFollowSource(demo_trace), Seekable)


def test_a_followed_trace_is_waited_for_then_read(tmp_path: Path, demo_trace: Path) -> None:
    path = tmp_path / "run.memdoc"
    source = TraceFollowSource(path)
    state = source.poll()
    assert state.trace is None and state.live
    assert state.notes == (f"waiting for {path} to be written",)
    shutil.copy(demo_trace, path)
    state = source.poll()
    assert state.trace is not None and not state.live  # the end record is there
    assert state.now_t == pytest.approx(state.trace.duration_s)


def test_following_a_file_that_is_not_a_trace_says_so_without_raising(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a trace\n")
    state = TraceFollowSource(path).poll()
    assert state.error is not None and "not a memdoc trace" in state.error


def test_a_paused_follow_keeps_reading_but_shows_the_paused_instant(
    tmp_path: Path, demo_trace: Path
) -> None:
    lines = demo_trace.read_bytes().splitlines(keepends=True)
    path = tmp_path / "run.memdoc"
    path.write_bytes(b"".join(lines[: len(lines) // 2]))
    source = TraceFollowSource(path)
    paused_at = source.poll().now_t
    source.set_paused(True)
    path.write_bytes(b"".join(lines))
    state = source.poll()
    assert state.paused and state.now_t == paused_at
    assert state.trace is not None and state.trace.duration_s > paused_at
    source.set_paused(False)
    assert source.poll().now_t == pytest.approx(state.trace.duration_s)


def test_the_system_view_shows_every_gpu_and_process_the_driver_reports() -> None:
    # Two RTX A5000 as `nvidia-smi -q -x` recorded them, one process on each.
    gate = gate_from_nvidia_smi_xml(
        FIXTURES / "importers" / "nvidia-smi-xml" / "dual_a5000-v13.xml"
    )
    source = SystemSource(0.1, gate_factory=lambda: gate)
    feed = Feed(source, rules=no_rules)
    view = feed.next_frame(ViewRequest(device=1)).view
    source.close()
    assert [tab.index for tab in view.tabs] == [0, 1]
    assert view.device == 1
    assert isinstance(view.ledger, DeviceBar) and view.ledger.ledger.total_bytes == 24564 * MiB
    # memdoc top watches: the process on the GPU is just a process, not "another" one.
    assert ("processes", 17246 * MiB) in [(s.label, s.size_bytes) for s in view.ledger.segments()]
    assert [(r.pid, r.gpu_bytes, r.ours) for r in view.processes] == [(100477, 17246 * MiB, False)]
    assert view.host is not None and view.host.available_bytes is not None
    assert view.host.rss_bytes is None  # memdoc's own RSS is not shown as if it were a run
    assert not view.status.notes
    assert gate.closed


def test_without_a_driver_the_system_view_shows_host_memory_and_says_why_once() -> None:
    try:
        open_gate().close()
    except NvmlUnavailable:
        pass
    else:
        pytest.skip("this machine has a working NVIDIA driver")
    source = SystemSource(0.1)
    state = source.poll()
    source.close()
    assert state.notes == (
        "NVML not found: no NVIDIA driver on this machine; showing host memory only",
    )
    assert state.trace is not None and state.trace.devices() == []
    assert state.trace.series(Metric.HOST_AVAILABLE) is not None


def test_rules_rerun_at_most_every_interval_and_see_only_what_was_shown(demo_trace: Path) -> None:
    seen: list[float] = []

    def rules(trace):  # type: ignore[no-untyped-def]
        seen.append(trace.duration_s)
        return list(FINDINGS)

    clock = ManualClock()
    source = ReplaySource(load_trace(demo_trace), clock=clock, start_s=10.0)
    feed = Feed(source, rules=rules, monotonic=clock, rules_interval_s=2.0)
    first = feed.next_frame(ViewRequest())
    assert first.findings == FINDINGS
    clock.advance(1.0)
    assert feed.next_frame(ViewRequest()).findings is None  # too soon
    clock.advance(1.5)
    assert feed.next_frame(ViewRequest()).findings == FINDINGS
    assert seen == [pytest.approx(10.0, abs=0.11), pytest.approx(12.5, abs=0.11)]


def test_a_rule_that_failed_is_named_in_the_frame_and_the_others_still_show(
    demo_trace: Path,
) -> None:
    from memdoc.rules.engine import Findings

    def rules(trace: object) -> Findings:
        return Findings(FINDINGS, ["rule broken failed on this trace (ZeroDivisionError)"])

    clock = ManualClock()
    source = ReplaySource(load_trace(demo_trace), clock=clock, start_s=10.0)
    frame = Feed(source, rules=rules, monotonic=clock).next_frame(ViewRequest())

    assert frame.findings == FINDINGS
    assert frame.rules_error is not None and "rule broken failed" in frame.rules_error


def test_live_replays_files_other_tools_wrote(tmp_path: Path) -> None:
    from memdoc.cli.live import open_source

    xml = FIXTURES / "importers" / "nvidia-smi-xml" / "dual_a5000-v13.xml"
    source = open_source([xml], replay=False, speed=2.0)
    assert isinstance(source, ReplaySource) and source.speed == 2.0
    view = Feed(source, rules=no_rules).next_frame(ViewRequest()).view
    assert [tab.name for tab in view.tabs] == ["RTX A5000", "RTX A5000"]
    assert isinstance(view.ledger, DeviceBar) and view.ledger.ledger.term(FREE) is not None
