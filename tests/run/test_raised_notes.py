"""Memory errors noted as they rise out of a wrapped framework call: written as caught once
the program goes on, replaced by the recording of the same error otherwise."""

from __future__ import annotations

from typing import Any

from memdoc.session import Session
from memdoc.trace.model import Event, EventKind


class _Events:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def event(self, event: Event) -> None:
        self.events.append(event)

    def ooms(self) -> list[dict[str, Any]]:
        return [dict(e.data) for e in self.events if e.kind == EventKind.OOM]

    def samples(self, *args: object) -> None: ...

    def device(self, *args: object) -> None: ...

    def process(self, *args: object) -> None: ...

    def collector(self, *args: object) -> None: ...


def _oom() -> RuntimeError:
    try:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 67108864 bytes. Error code 12 (Cannot allocate memory)"
        )
    except RuntimeError as exc:
        return exc


def _session() -> tuple[Session, _Events]:
    sink = _Events()
    return Session(sink), sink  # type: ignore[arg-type]


def test_a_noted_error_is_written_as_caught_at_the_next_step_with_the_outer_frames() -> None:
    session, sink = _session()
    session.note_raised(_oom(), ["train.py:40:<module>"])
    assert sink.ooms() == []  # not yet: the program may not catch it

    session.step()

    [oom] = sink.ooms()
    assert oom["where"] == "caught" and oom["handled"] is True
    assert oom["oom"]["requested_bytes"] == 64 << 20
    assert oom["stack"][0] == "train.py:40:<module>"


def test_a_noted_error_recorded_as_uncaught_is_written_once_as_uncaught() -> None:
    session, sink = _session()
    exc = _oom()
    session.note_raised(exc)
    session.note_raised(exc)  # raised through a second wrapped call: one note

    session.record_exception(exc, where="uncaught")
    session.stop()

    assert [oom["where"] for oom in sink.ooms()] == ["uncaught"]


def test_notes_still_pending_when_the_session_stops_are_written() -> None:
    session, sink = _session()
    session.note_raised(_oom())
    session.note_raised(_oom())

    session.stop()

    assert [oom["where"] for oom in sink.ooms()] == ["caught", "caught"]
