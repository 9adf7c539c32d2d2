"""Memory errors noted as they rise out of a wrapped framework call: written as caught once
the program goes on, replaced by the recording of the same error otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from memdoc.caught import noting_collections
from memdoc.collectors.loops import hub
from memdoc.session import Session
from memdoc.trace.model import HANDLED_WHEN_RAISED, Event, EventKind


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


def _collection_while_read(
    monkeypatch: pytest.MonkeyPatch, session: Session, exc: RuntimeError
) -> None:
    """Each time the session reads `exc` (which allocates), a garbage collection starts
    with `exc` in hand, as the program's handler holds it."""
    collecting = noting_collections(lambda: session)
    read = session._exception_events

    def reading(*args: Any, **kwargs: Any) -> list[Event]:
        try:
            raise exc
        except RuntimeError:
            collecting("start", {})
        return read(*args, **kwargs)

    monkeypatch.setattr(session, "_exception_events", reading)


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


def test_in_a_batch_size_search_an_error_a_collection_sees_is_kept_as_the_finder_records_it() -> (
    None
):
    session, sink = _session()
    collecting = noting_collections(lambda: session)
    exc = _oom()
    hub.enter(hub.SEARCH, "lightning", grad_enabled=None)
    try:
        try:
            raise exc
        except RuntimeError:
            collecting("start", {})  # a collection inside the finder's handling, before it looks
            session.record_exception(exc, where="caught", context={"batch_size": 32})
    finally:
        hub.leave(hub.SEARCH, "lightning")
    session.step()
    session.stop()

    [oom] = sink.ooms()
    assert oom["where"] == "caught" and oom["batch_size"] == 32


def test_outside_a_search_an_error_a_collection_sees_is_caught_once_the_program_goes_on() -> None:
    session, sink = _session()
    collecting = noting_collections(lambda: session)
    try:
        raise _oom()
    except RuntimeError:
        collecting("start", {})
    # not yet: a handler may still exit on it (recorded then, with the memory at its exit)
    assert sink.ooms() == []

    session.step()

    [oom] = sink.ooms()
    assert oom["where"] == "caught" and oom["handled"] is True


def test_an_error_a_collection_sees_while_its_exit_is_recorded_is_written_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session, sink = _session()
    exc = _oom()
    _collection_while_read(monkeypatch, session, exc)  # recording the exit allocates
    session.record_exception(exc, exc.__traceback__, where="exit")
    session.stop()

    [oom] = sink.ooms()
    assert oom["where"] == "exit" and "handled" not in oom


@pytest.mark.parametrize("in_search", [True, False], ids=["in-a-search", "outside-a-search"])
def test_a_collection_while_an_error_is_being_noted_leaves_it_to_the_note(
    monkeypatch: pytest.MonkeyPatch, in_search: bool
) -> None:
    session, sink = _session()
    exc = _oom()
    _collection_while_read(monkeypatch, session, exc)  # reading the error allocates
    if in_search:
        hub.enter(hub.SEARCH, "lightning", grad_enabled=None)
    try:
        session.note_raised(exc, ["train.py:40:<module>"])
    finally:
        if in_search:
            hub.leave(hub.SEARCH, "lightning")
    session.stop()

    [oom] = sink.ooms()  # once, not noted or recorded again by the collection
    assert oom["stack"][0] == "train.py:40:<module>"  # the wrapper's note, with its frames


def test_errors_still_being_handled_when_the_last_was_raised_are_recorded_before_it() -> None:
    session, sink = _session()

    def attempt(size: int) -> None:
        try:
            raise RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                f"allocate memory: you tried to allocate {size} bytes. Error code 12 (Cannot "
                "allocate memory)"
            )
        except RuntimeError:
            if size <= 16 << 20:
                raise
            try:
                raise KeyError("not a memory error, handled on the way")
            except KeyError:
                attempt(size // 2)  # the retry, inside the handler of the failed try

    try:
        attempt(64 << 20)
    except RuntimeError as last:
        session.record_exception(last, where="uncaught")
    session.stop()

    ooms = sink.ooms()
    assert [o["oom"]["requested_bytes"] >> 20 for o in ooms] == [64, 32, 16]
    assert [o["where"] for o in ooms] == ["caught", "caught", "uncaught"]
    assert [bool(o.get(HANDLED_WHEN_RAISED)) for o in ooms] == [True, True, False]
    assert "host" not in ooms[0]  # the memory now is not the memory then


def test_an_error_handled_before_and_recorded_then_is_not_recorded_twice() -> None:
    session, sink = _session()
    first = _oom()
    session.record_exception(first, where="caught")  # seen as it was caught (Python 3.12)
    try:
        try:
            raise first
        except RuntimeError:
            raise _oom() from None
    except RuntimeError as last:
        session.record_exception(last, where="uncaught")

    assert [o["where"] for o in sink.ooms()] == ["caught", "uncaught"]


def test_an_error_raised_in_place_of_another_is_one_failure_not_a_retry() -> None:
    session, sink = _session()
    try:
        try:
            raise _oom()  # a framework's internal status error, with the same words
        except RuntimeError as status:
            raise MemoryError(str(status)) from None  # told again as its public error
    except MemoryError as public:
        session.record_exception(public, where="uncaught")

    assert [o["where"] for o in sink.ooms()] == ["uncaught"]
