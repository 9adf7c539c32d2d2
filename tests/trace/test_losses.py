"""Loss records: what agents dropped while memdoc could not keep up, read back as `Loss`."""

from __future__ import annotations

import time
from pathlib import Path

from memdoc.report.data import loss_warnings
from memdoc.trace import Loss, Run, load_trace
from memdoc.trace.model import SCHEMA_VERSION, Event, EventKind, Header
from memdoc.trace.writer import TraceWriter


def _trace_with(tmp_path: Path, *events: Event) -> Path:
    start = time.time()
    path = tmp_path / "t.memdoc"
    writer = TraceWriter(
        path, Header(version=SCHEMA_VERSION, created_unix=start, memdoc_version="t")
    )
    for event in events:
        writer.event(Event(t=start + event.t, kind=event.kind, pid=event.pid, data=event.data))
    writer.close()
    return path


def test_a_loss_event_reads_back_with_its_counts_process_and_time_range(tmp_path: Path) -> None:
    path = _trace_with(
        tmp_path,
        Event(5.5, EventKind.LOSS, 4243, {"samples": 12, "events": 3000, "duration_s": 2.25}),
        Event(6.0, EventKind.LOSS, 4243, {"samples": "many"}),  # damaged: left out
    )

    trace = load_trace(path)

    assert trace.losses() == [Loss(pid=4243, start_s=3.25, end_s=5.5, samples=12, events=3000)]
    assert loss_warnings(Run([trace])) == [
        "12 samples/3000 events from PID 4243 were lost between 3.2 s and 5.5 s"
        " while memdoc could not keep up"
    ]


def test_a_trace_without_losses_warns_about_none(tmp_path: Path) -> None:
    trace = load_trace(_trace_with(tmp_path, Event(1.0, EventKind.STEP, 1, {"step": 1})))

    assert trace.losses() == []
    assert loss_warnings(Run([trace])) == []
