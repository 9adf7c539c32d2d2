"""A 4 MB snapshot pickle of a million references to one segment, whose blocks are a million
references to one block: 10^12 blocks to whoever walks it naively. Imported, sitting in a
run folder, or named as a trace's snapshot, it is refused in one line, at once."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from tests.conftest import run_memdoc
from tests.report.traces import write_oom_run

SHARED = 10**6
# A refusal is immediate; a walk of 10^12 blocks never ends.
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def shared_snapshot(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    block = {"address": 0, "size": 512, "state": "inactive"}  # neither history nor frames
    segment = {"device": 0, "address": 0, "total_size": 512, "blocks": [block] * SHARED}
    data = pickle.dumps({"segments": [segment] * SHARED, "device_traces": []}, protocol=4)
    assert len(data) < 5 * 2**20
    return data


def _timed(*args: str, cwd: Path) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = run_memdoc(*args, cwd=cwd, timeout=TIMEOUT_S)
    elapsed = time.monotonic() - started
    return done.returncode, done.stdout.decode(), done.stderr.decode(), elapsed


def test_import_refuses_it_in_one_line_at_once(tmp_path: Path, shared_snapshot: bytes) -> None:
    (tmp_path / "snapshot.pickle").write_bytes(shared_snapshot)

    status, _, err, elapsed = _timed("import", "snapshot.pickle", "-o", "out.memdoc", cwd=tmp_path)

    assert status == 2, err
    (line,) = err.splitlines()
    assert line == (
        "memdoc: error: snapshot.pickle: damaged snapshot (the same records are reused over "
        "and over)"
    )
    assert elapsed < 30
    assert not (tmp_path / "out.memdoc").exists()


@pytest.mark.parametrize("command", ["diagnose", "report"])
def test_named_as_a_traces_snapshot_it_is_left_out_and_the_trace_read(
    tmp_path: Path, shared_snapshot: bytes, command: str
) -> None:
    (tmp_path / "snapshot.pickle").write_bytes(shared_snapshot)
    write_oom_run(tmp_path / "run.memdoc", snapshot="snapshot.pickle")

    status, out, err, _ = _timed(command, "run.memdoc", cwd=tmp_path)

    assert status == (3 if command == "diagnose" else 0), err
    assert "Traceback" not in out + err
    said = out if command == "diagnose" else (tmp_path / "run.html").read_text()
    words = " ".join(said.split())
    assert (
        "snapshot.pickle: damaged snapshot (the same records are reused over and over); "
        "allocation sites left out"
    ) in words


def test_sitting_in_a_run_folder_it_is_left_out_and_the_trace_read(
    tmp_path: Path, shared_snapshot: bytes
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "evil.memdoc").write_bytes(shared_snapshot)
    write_oom_run(folder / "run.memdoc")

    status, _, err, _ = _timed("diagnose", "runs", cwd=tmp_path)

    assert status == 3, err
    (line,) = [line for line in err.splitlines() if "evil.memdoc" in line]
    assert line.startswith("memdoc: warning: runs/evil.memdoc: not a memdoc trace")
