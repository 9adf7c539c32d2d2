"""A FIFO where a file is expected: opening it would wait for a writer forever. `diagnose`,
`import` and `report` refuse it in one line, and a FIFO named as a trace's snapshot is left
out while the trace is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_memdoc
from tests.report.traces import write_oom_run

# A refusal is immediate; a blocked open never returns.
TIMEOUT_S = 30.0


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "run.memdoc"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("diagnose",), id="diagnose"),
        pytest.param(("report", "-o", "out.html"), id="report"),
        pytest.param(("import", "-o", "out.memdoc"), id="import"),
    ],
)
def test_a_fifo_given_as_input_is_refused_in_one_line(
    tmp_path: Path, fifo: Path, args: tuple[str, ...]
) -> None:
    done = run_memdoc(*args[:1], fifo.name, *args[1:], cwd=tmp_path, timeout=TIMEOUT_S)

    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.splitlines()[0] == (
        "memdoc: error: run.memdoc: not a regular file (a pipe or a device); not reading it"
    )
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.memdoc"]


def test_a_fifo_named_as_a_traces_snapshot_is_left_out_and_the_trace_read(
    tmp_path: Path,
) -> None:
    os.mkfifo(tmp_path / "snapshot.pickle")
    write_oom_run(tmp_path / "crash.memdoc", snapshot="snapshot.pickle")

    done = run_memdoc("diagnose", "crash.memdoc", cwd=tmp_path, timeout=TIMEOUT_S)

    out = done.stdout.decode()
    assert done.returncode == 3, done.stderr.decode()
    words = " ".join(out.split())
    assert "snapshot.pickle: not a regular file (a pipe or a device)" in words
    assert "allocation sites left out" in words


def test_a_fifo_in_a_run_folder_is_passed_over(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    os.mkfifo(folder / "pipe.memdoc")
    write_oom_run(folder / "crash.memdoc")

    done = run_memdoc("diagnose", "runs", cwd=tmp_path, timeout=TIMEOUT_S)

    assert done.returncode == 3, done.stderr.decode()
