"""A temporary folder whose path is too long for a Unix socket (a job's TMPDIR deep in a
scratch file system): memdoc run records anyway, its socket in a shorter folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memdoc.run.rundir import MAX_SOCKET_PATH, SOCKET_NAME, create_run_dir
from memdoc.trace import load_trace
from tests.conftest import run_memdoc


def _long_tmpdir(tmp_path: Path) -> Path:
    folder = tmp_path / ("d" * 100)
    folder.mkdir()
    assert len(os.fsencode(folder / SOCKET_NAME)) > MAX_SOCKET_PATH
    return folder


def test_the_run_folder_of_a_long_tmpdir_has_a_socket_path_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(_long_tmpdir(tmp_path)))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    folder = create_run_dir()
    try:
        assert len(os.fsencode(folder / SOCKET_NAME)) <= MAX_SOCKET_PATH
    finally:
        folder.rmdir()


def test_memdoc_run_records_under_a_tmpdir_too_long_for_a_socket(tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text("import memdoc\nfor _ in range(3):\n    memdoc.step()\n")
    env = {"TMPDIR": str(_long_tmpdir(tmp_path))}

    done = run_memdoc("run", "-q", "-o", "t.memdoc", "steps.py", cwd=tmp_path, env=env)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    trace = load_trace(tmp_path / "t.memdoc")
    assert trace.complete
    assert len(trace.steps()) == 3
