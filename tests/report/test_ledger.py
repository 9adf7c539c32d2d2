"""The report's ledgers: each GPU at its peak and at the OOM, the same as the dashboard's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.demo_trace import DemoRun, write_demo_trace
from memdoc.report.data import ReportData
from memdoc.report.ledger import device_ledgers
from memdoc.trace import load_run, load_trace
from memdoc.trace.ledger import (
    ALLOCATED,
    CACHED_FREE,
    FREE,
    OTHER_PROCESSES,
    PROCESS_OTHER,
    UNEXPLAINED,
)
from memdoc.tui.ledger import DeviceBar
from memdoc.tui.sources import KIND_REPLAY, SourceState
from memdoc.tui.timeline import EventIndex
from memdoc.tui.view import ViewRequest, build_view
from memdoc.units import GiB, parse_size
from tests.report.traces import H200_TOTAL, write_clean_h200_run, write_oom_run


def _size(text: str) -> int:
    value = parse_size(text)
    assert value is not None
    return value


def test_terms_add_up_to_the_device_total_at_peak_and_at_the_oom(tmp_path: Path) -> None:
    trace = load_trace(write_oom_run(tmp_path / "run.memdoc"))
    oom = trace.ending_oom()

    ledgers = device_ledgers(trace, oom, trace.oom_events()[-1].t)

    assert [lg.moment for lg in ledgers] == ["peak", "oom"]
    for ledger in ledgers:
        assert ledger.total_bytes == _size("15.58 GiB")
        assert ledger.accounted_bytes == ledger.total_bytes
        assert all(term.bytes >= 0 for term in ledger.terms), ledger.terms


def test_terms_add_up_on_every_device_of_a_multi_gpu_run(tmp_path: Path) -> None:
    trace = load_trace(write_clean_h200_run(tmp_path / "run.memdoc", devices=2))

    ledgers = device_ledgers(trace, None, None)

    assert [(lg.device, lg.moment) for lg in ledgers] == [(0, "peak"), (1, "peak")]
    assert [lg.accounted_bytes for lg in ledgers] == [H200_TOTAL, H200_TOTAL]


def test_the_oom_ledger_takes_the_numbers_of_the_error_message(tmp_path: Path) -> None:
    trace = load_trace(write_oom_run(tmp_path / "run.memdoc"))

    at_oom = device_ledgers(trace, trace.ending_oom(), 23.0)[-1]

    assert at_oom.source == "oom message"
    assert at_oom.term(ALLOCATED) == _size("13.64 GiB")
    assert at_oom.term(CACHED_FREE) == _size("67.23 MiB")
    assert at_oom.term(FREE) == _size("71.25 MiB")
    # What the driver counts for this process beyond PyTorch's pool: context and the like.
    reserved = _size("13.64 GiB") + _size("67.23 MiB")
    assert at_oom.term(PROCESS_OTHER) == _size("13.94 GiB") - reserved
    # The message does not list other processes: the trace's per-process sample does.
    assert at_oom.term(OTHER_PROCESSES) == pytest.approx(1.0 * GiB)


def _demo(path: Path) -> Path:
    return write_demo_trace(path, DemoRun(devices=2, seconds=30.0))


def _oom_run(path: Path) -> Path:
    return write_oom_run(path)


@pytest.mark.parametrize(
    ("write", "device"),
    [
        pytest.param(_demo, 0, id="dashboard-demo-gpu0-beside-another-process"),
        pytest.param(_demo, 1, id="dashboard-demo-gpu1"),
        pytest.param(_oom_run, 0, id="report-oom-run"),
    ],
)
def test_the_dashboard_and_the_report_give_the_same_ledger_at_the_same_instant(
    tmp_path: Path, write: Callable[[Path], Path], device: int
) -> None:
    # GIVEN one trace, the report's ledger at a device's peak
    path = write(tmp_path / "run.memdoc")
    report = ReportData.from_run(load_run([path]), [])
    at_peak = next(lg for lg in report.ledgers if lg.device == device and lg.moment == "peak")
    assert at_peak.t is not None
    # WHEN the dashboard shows that device at that instant
    trace = load_trace(path)
    events = EventIndex()
    events.update(trace)
    state = SourceState(KIND_REPLAY, path.name, trace, now_t=at_peak.t, paused=True)
    view = build_view(state, events, ViewRequest(device=device), 0.0)
    # THEN both show the same terms, and the bar draws each of them at its size
    assert isinstance(view.ledger, DeviceBar)
    shown = view.ledger.ledger
    assert (shown.total_bytes, shown.terms, shown.unknown) == (
        at_peak.total_bytes,
        at_peak.terms,
        at_peak.unknown,
    )
    bar = {s.key: s.size_bytes for s in view.ledger.segments()}
    assert bar["allocated"] == at_peak.term(ALLOCATED)
    assert bar["free"] == at_peak.term(FREE)
    assert bar.get("unexplained", 0) == at_peak.term(UNEXPLAINED)
    assert sum(size or 0 for size in bar.values()) == at_peak.total_bytes
