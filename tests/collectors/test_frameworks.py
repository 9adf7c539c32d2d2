"""Framework collectors stay silent until the program imports the framework, then start."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from memdoc.collectors.base import SessionHandle, Values
from memdoc.collectors.frameworks import (
    SNAPSHOT_DIR_ENV,
    ArtifactDir,
    FrameworkCollector,
    LazyFrameworkCollector,
    framework_collectors,
    notify_mark,
    oom_context,
)
from memdoc.trace.model import CollectorStatus, SeriesKey
from tests.collectors.framework_helpers import RecordingSession

MODULE = "memdoc_test_framework"


class PlainCollector:
    """The smallest framework collector: one value per tick, context for KeyError only."""

    name = "demo"

    def __init__(self, *, start_error: Exception | None = None) -> None:
        self.start_error = start_error
        self.closed = False
        self.marks: list[str] = []

    def probe(self) -> CollectorStatus:
        return CollectorStatus(name="demo", available=True, version="1.0")

    def start(self, session: SessionHandle) -> None:
        if self.start_error is not None:
            raise self.start_error

    def sample(self, unix_t: float) -> Values:
        return {SeriesKey("demo.allocated", -1): 42}

    def close(self) -> None:
        self.closed = True

    def oom_context(self, exc: BaseException) -> Mapping[str, Any] | None:
        return {"stats": {"demo": True}} if isinstance(exc, KeyError) else None

    def on_mark(self, label: str, data: Mapping[str, Any]) -> None:
        self.marks.append(label)


@pytest.fixture
def fake_module() -> Iterator[types.ModuleType]:
    """A module the 'program' imports, put in sys.modules the way the import system does."""
    module = types.ModuleType(MODULE)
    module.__spec__ = importlib.machinery.ModuleSpec(MODULE, loader=None)
    yield module
    sys.modules.pop(MODULE, None)


def lazy(collector: PlainCollector) -> tuple[LazyFrameworkCollector, list[int]]:
    made: list[int] = []

    def factory() -> FrameworkCollector:
        made.append(1)
        return collector

    return LazyFrameworkCollector("demo", MODULE, factory), made


def test_nothing_runs_until_the_program_has_imported_the_framework(
    fake_module: types.ModuleType,
) -> None:
    collector = PlainCollector()
    wrapper, made = lazy(collector)
    session = RecordingSession()
    wrapper.start(session)

    before = wrapper.sample(1.0)
    sys.modules[MODULE] = fake_module
    after = wrapper.sample(1.1)

    assert before == {}
    assert after == {SeriesKey("demo.allocated", -1): 42}
    assert made == [1]
    assert [(s.name, s.available, s.version) for s in session.statuses] == [("demo", True, "1.0")]


def test_a_framework_still_being_imported_is_left_alone(fake_module: types.ModuleType) -> None:
    wrapper, made = lazy(PlainCollector())
    wrapper.start(RecordingSession())
    assert fake_module.__spec__ is not None
    fake_module.__spec__._initializing = True  # type: ignore[attr-defined]
    sys.modules[MODULE] = fake_module

    importing = wrapper.sample(1.0)
    fake_module.__spec__._initializing = False  # type: ignore[attr-defined]
    imported = wrapper.sample(1.1)

    assert importing == {} and imported != {}
    assert made == [1]


def test_a_collector_that_cannot_start_is_reported_once_and_never_retried(
    fake_module: types.ModuleType,
) -> None:
    wrapper, made = lazy(PlainCollector(start_error=RuntimeError("no runtime")))
    session = RecordingSession()
    sys.modules[MODULE] = fake_module
    wrapper.start(session)

    samples = [wrapper.sample(1.0 + i) for i in range(3)]
    wrapper.close()

    assert samples == [{}, {}, {}]
    assert made == [1]
    (status,) = session.statuses
    assert not status.available
    assert "no runtime" in (status.reason or "")


def test_a_framework_the_program_never_imported_is_said_so_at_the_end() -> None:
    wrapper, made = lazy(PlainCollector())
    session = RecordingSession()
    wrapper.start(session)
    wrapper.sample(1.0)

    wrapper.close()

    assert made == []
    (status,) = session.statuses
    assert (status.available, status.reason) == (False, f"the program did not import {MODULE}")


def test_hooks_reach_the_started_collector_and_contexts_merge_first_answer_first(
    fake_module: types.ModuleType,
) -> None:
    collector = PlainCollector()
    wrapper, _ = lazy(collector)
    sys.modules[MODULE] = fake_module
    wrapper.start(RecordingSession())
    other = PlainCollector()

    notify_mark([object(), wrapper], "eval", {"snapshot": True})
    merged = oom_context([object(), wrapper, other], KeyError("x"))
    nothing = oom_context([wrapper], ValueError("x"))
    wrapper.close()

    assert collector.marks == ["eval"]
    assert merged == {"stats": {"demo": True}}
    assert nothing == {}
    assert collector.closed


def test_there_is_one_lazy_collector_per_framework() -> None:
    assert [c.name for c in framework_collectors()] == ["pytorch", "tensorflow", "jax"]


def test_files_go_beside_the_trace_and_events_name_them_relative_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SNAPSHOT_DIR_ENV, raising=False)
    files = ArtifactDir(tmp_path)

    first = files.write("memdoc-snapshot-oom", ".pickle", b"one")
    second = files.write("memdoc-snapshot-oom", ".pickle", b"two")

    assert first != second
    assert (tmp_path / first).read_bytes() == b"one"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first, second])


def test_the_snapshot_folder_can_be_chosen_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SNAPSHOT_DIR_ENV, str(tmp_path / "snapshots"))
    files = ArtifactDir(tmp_path / "traces")

    path = files.write("memdoc-jax-memory", ".prof", b"\x1f\x8b")

    assert path.startswith("../snapshots/")
    assert (tmp_path / "traces" / path).resolve().read_bytes() == b"\x1f\x8b"
