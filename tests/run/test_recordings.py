"""The registry of recordings: a run announces itself while it records, and only then."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import memdoc
from memdoc.recordings import live_recordings, register, registry_dirs, unregister
from memdoc.trace import load_trace
from tests.conftest import memdoc_cmd

# Sleeps until the test says stop (a file appears), at most ~5 s.
SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    for _ in range(50):
        if os.path.exists(sys.argv[1]):
            break
        time.sleep(0.1)
    """
)


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("it did not happen in time")
        time.sleep(0.05)


def test_a_registered_recording_is_listed_until_it_is_unregistered(tmp_path: Path) -> None:
    folder = tmp_path / "memdoc"
    entry = register("runs/a.memdoc", ["python", "train.py"], directory=folder)
    assert entry is not None and entry.name == f"{os.getpid()}.json"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    [found] = live_recordings(folder)
    assert found.pid == os.getpid()
    assert found.trace_path == Path.cwd() / "runs" / "a.memdoc"
    assert found.command == ("python", "train.py")
    assert found.started_unix == pytest.approx(time.time(), abs=5)
    unregister(entry)
    assert live_recordings(folder) == []
    assert list(folder.iterdir()) == []


def test_two_recordings_of_one_process_each_have_an_entry(tmp_path: Path) -> None:
    first = register("a.memdoc", [], directory=tmp_path / "memdoc")
    second = register("b.memdoc", [], directory=tmp_path / "memdoc")
    assert first is not None and second is not None and first != second
    assert [r.trace_path.name for r in live_recordings(tmp_path / "memdoc")] == [
        "a.memdoc",
        "b.memdoc",
    ]
    unregister(second)
    assert [r.trace_path.name for r in live_recordings(tmp_path / "memdoc")] == ["a.memdoc"]


def _entry(folder: Path, name: str, pid: int, started_unix: float) -> Path:
    path = folder / name
    record = {"pid": pid, "trace": "/x/run.memdoc", "started_unix": started_unix, "command": []}
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    ("make", "cleaned"),
    [
        pytest.param(lambda f: _entry(f, "1.json", _ended_pid(), time.time()), True, id="ended"),
        pytest.param(
            lambda f: _entry(f, "2.json", os.getpid(), time.time() - 3 * 86400 * 365),
            True,
            id="pid-reused-since",
        ),
        pytest.param(
            lambda f: _write(f / f"{_ended_pid()}.json", "{not json"), True, id="damaged-ended"
        ),
        pytest.param(
            lambda f: _write(f / f"{os.getpid()}-9.json", "{not json"), False, id="damaged-live"
        ),
    ],
)
def test_entries_of_recordings_that_ended_are_ignored_and_removed(
    tmp_path: Path, make: Callable[[Path], Path], cleaned: bool
) -> None:
    folder = tmp_path / "memdoc"
    live = register("live.memdoc", [], directory=folder)
    stale = make(folder)
    assert [r.trace_path.name for r in live_recordings(folder)] == ["live.memdoc"]
    assert stale.exists() != cleaned
    assert live is not None and live.exists()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_folder_others_can_write_to_is_neither_written_nor_read(tmp_path: Path) -> None:
    folder = tmp_path / "memdoc"
    folder.mkdir()
    _entry(folder, f"{os.getpid()}.json", os.getpid(), time.time())
    folder.chmod(0o777)  # another user could have put made-up entries there
    assert register("a.memdoc", [], directory=folder) is None
    assert live_recordings(folder) == []


def test_without_a_usable_folder_there_is_no_registry_and_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("in the way")
    assert register("a.memdoc", ["python"], directory=blocked / "memdoc") is None
    assert live_recordings(blocked / "memdoc") == []
    unregister(None)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own temp folder, so that no other run on the machine is seen."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return folder


def test_recordings_go_to_the_runtime_folder_when_there_is_one_else_to_the_temp_folder(
    tmp_path: Path, private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_tmp = private_tmp / f"memdoc-{os.getuid()}"
    assert registry_dirs() == [in_tmp]
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert registry_dirs() == [in_tmp]
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert registry_dirs() == [tmp_path / "memdoc", in_tmp]


def test_a_reader_with_a_runtime_folder_sees_a_job_that_had_none(
    tmp_path: Path, private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch job often runs without XDG_RUNTIME_DIR; the login shell running top has one.
    entry = register("job.memdoc", ["train.py"])
    assert entry is not None and entry.parent == private_tmp / f"memdoc-{os.getuid()}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert [r.trace_path.name for r in live_recordings()] == ["job.memdoc"]
    unregister(entry)


def test_memdoc_watch_is_listed_while_its_block_runs(
    tmp_path: Path, private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with memdoc.watch(tmp_path / "w.memdoc", quiet=True, interval=0.05):
        inside = live_recordings(tmp_path / "memdoc")
    assert [(r.pid, r.trace_path) for r in inside] == [(os.getpid(), tmp_path / "w.memdoc")]
    assert live_recordings() == []
    assert list((tmp_path / "memdoc").iterdir()) == []


def test_memdoc_watch_falls_back_to_the_temp_folder_and_records_as_usual(
    tmp_path: Path, private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "memdoc").write_text("a file where the folder would go")
    with memdoc.watch(tmp_path / "w.memdoc", quiet=True, interval=0.05):
        inside = live_recordings()
    assert [r.trace_path for r in inside] == [tmp_path / "w.memdoc"]
    assert load_trace(tmp_path / "w.memdoc").complete


def test_memdoc_run_is_listed_while_the_program_runs_and_not_after(tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("MEMDOC_AGENT", None)
    stop = tmp_path / "stop"
    run = subprocess.Popen(
        memdoc_cmd("run", "-q", "-o", "t.memdoc", "sleeper.py", str(stop)), cwd=tmp_path, env=env
    )
    try:
        _wait_for(lambda: bool(live_recordings(runtime / "memdoc")))
        [found] = live_recordings(runtime / "memdoc")
        assert found.pid == run.pid
        assert found.trace_path == tmp_path / "t.memdoc"
        assert found.command == ("sleeper.py", str(stop))
        stop.touch()
        assert run.wait(timeout=60) == 0
    finally:
        stop.touch()
        run.wait(timeout=60)
    assert list((runtime / "memdoc").iterdir()) == []
    assert load_trace(tmp_path / "t.memdoc").complete
