"""A trace's events read back as they were written, whatever their data, kept as columns."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from memdoc.trace import (
    SCHEMA_VERSION,
    Event,
    EventKind,
    Header,
    Trace,
    TraceWriter,
    codec,
    load_trace,
)
from memdoc.trace.eventlog import MAX_KINDS, MAX_SHAPES, MAX_STRINGS
from memdoc.trace.reader import load_trace_lines

T0 = 1000.0
HEADER = Header(version=SCHEMA_VERSION, created_unix=T0, memdoc_version="test")


def _written(path: Path, events: list[Event]) -> Trace:
    """`events` (times relative to the start) written with the real writer, then read."""
    writer = TraceWriter(path, HEADER)
    for event in events:
        writer.event(Event(T0 + event.t, event.kind, event.pid, event.data))
    writer.close()
    return load_trace(path)


def _read(records: list[dict[str, Any]]) -> Trace:
    """A trace of these event records, lines a writer may not write (damage, other writers)."""
    lines = [codec.encode_header(HEADER), *(json.dumps({"type": "event", **r}) for r in records)]
    return load_trace_lines(line.encode() for line in lines)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"step": 3, "source": "optimizer"}, id="step"),
        pytest.param({}, id="no-data"),
        pytest.param({"a": 1, "b": -2.5, "c": "x", "d": True, "e": False, "f": None}, id="scalars"),
        pytest.param({"n": 2**63 - 1, "m": -(2**63)}, id="int64-bounds"),
        pytest.param({"f": 1.0, "z": -0.0, "tiny": 5e-324}, id="floats-stay-floats"),
        pytest.param({"oom": {"message": "CUDA out of memory", "shape": [2, 3]}}, id="nested"),
        pytest.param({"stack": ["a.py:1", "b.py:2"], "where": "watch"}, id="list"),
        pytest.param({"label": "caf\udce9 \u202e"}, id="lone-surrogate"),
    ],
)
def test_event_data_reads_back_equal_with_the_same_types(tmp_path: Path, data: Any) -> None:
    event = Event(0.5, EventKind.MARK, 4243, data)

    [read] = _written(tmp_path / "t.memdoc", [event]).events()

    assert read == event
    assert [type(v) for v in read.data.values()] == [type(v) for v in data.values()]
    assert list(read.data) == list(data)


@pytest.mark.parametrize(
    "record",
    [
        pytest.param({"pid": 2**40}, id="pid-past-32-bits"),
        pytest.param({"pid": -(2**31)}, id="pid-at-the-no-pid-mark"),
        pytest.param({"data": {"n": 2**64}}, id="int-past-64-bits"),
        pytest.param({"data": {"x": {"y": [1, {"z": None}]}}}, id="nested"),
    ],
)
def test_events_the_columns_cannot_hold_are_read_back_whole(record: dict[str, Any]) -> None:
    fields = {"t": 1.5, "kind": EventKind.NOTE, "pid": 7, "data": {"text": "x"}, **record}

    [read] = _read([fields]).events()

    assert read == Event(fields["t"], fields["kind"], fields["pid"], fields["data"])


def test_a_nan_inside_nested_data_reads_back() -> None:
    [read] = _read([{"t": 1.0, "kind": "mark", "data": {"x": {"y": float("nan")}}}]).events()

    assert math.isnan(read.data["x"]["y"])


@pytest.mark.parametrize(
    ("count", "make"),
    [
        pytest.param(MAX_KINDS + 5, lambda i: {"kind": f"kind-{i}"}, id="kinds"),
        pytest.param(MAX_SHAPES + 5, lambda i: {"data": {f"key-{i}": i}}, id="shapes"),
        pytest.param(MAX_STRINGS + 5, lambda i: {"data": {"label": f"label {i}"}}, id="strings"),
    ],
)
def test_events_past_the_tables_are_read_back_in_order(count: int, make: Any) -> None:
    records = [{"t": i * 0.01, "kind": "mark", "pid": 7, **make(i)} for i in range(count)]

    trace = _read(records)

    expected = [Event(r["t"], r["kind"], r["pid"], r.get("data", {})) for r in records]
    assert trace.events() == expected
    assert trace.events(expected[-1].kind) == [e for e in expected if e.kind == expected[-1].kind]


def test_events_of_every_kind_keep_the_order_they_were_recorded_in(tmp_path: Path) -> None:
    kinds = [EventKind.STEP, EventKind.MARK, EventKind.STEP, EventKind.OOM, EventKind.STEP]
    events = [Event(0.25 * i, kind, 7, {"step": i}) for i, kind in enumerate(kinds)]

    trace = _written(tmp_path / "t.memdoc", events)

    assert trace.events() == events
    assert list(trace.iter_events(2)) == events[2:]
    assert trace.event_count() == len(events)
    assert trace.events(EventKind.STEP) == [e for e in events if e.kind == EventKind.STEP]


def test_steps_follow_the_first_reporter_and_its_own_marks() -> None:
    # GIVEN optimizer steps in two processes, then the first one's own `memdoc.step()`
    records = [
        {"t": 1.0, "kind": "step", "pid": 7, "data": {"step": 1, "source": "optimizer"}},
        {"t": 1.1, "kind": "step", "pid": 8, "data": {"step": 1, "source": "optimizer"}},
        {"t": 2.0, "kind": "step", "pid": 7, "data": {"step": 1, "source": "user"}},
        {"t": 2.1, "kind": "step", "pid": 8, "data": {"step": 2, "source": "user"}},
        {"t": 3.0, "kind": "step", "pid": 7, "data": {"step": 2, "source": "user", "epoch": 0}},
    ]

    steps = _read(records).steps()

    assert [(e.t, e.data["step"]) for e in steps] == [(2.0, 1), (3.0, 2)]
    assert list(steps.times()) == [2.0, 3.0]
    assert steps.values("epoch") == [None, 0]


def test_a_view_is_a_sequence_that_does_not_see_later_events() -> None:
    trace = _read([{"t": float(i), "kind": "step", "data": {"step": i}} for i in range(5)])
    steps = trace.steps()

    trace.add_event(Event(9.0, EventKind.STEP, None, {"step": 9}))

    assert len(steps) == 5 and steps[-1].t == 4.0
    assert [e.t for e in steps[1:4:2]] == [1.0, 3.0]
    with pytest.raises(IndexError):
        steps[5]
    assert len(trace.steps()) == 6


def test_a_copy_and_its_trace_each_keep_only_their_own_later_events() -> None:
    trace = _read([{"t": 1.0, "kind": "mark", "data": {"label": "a"}}])
    twin = trace.copy()

    trace.add_event(Event(2.0, EventKind.MARK, None, {"label": "b"}))
    twin.add_event(Event(3.0, EventKind.MARK, None, {"label": "c", "new": 1}))

    assert [e.data["label"] for e in trace.marks()] == ["a", "b"]
    assert [e.data["label"] for e in twin.marks()] == ["a", "c"]
