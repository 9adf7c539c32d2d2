"""`memdoc import` as a user runs it: a trace out, or one line and exit 2, never a partial file."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from memdoc.cli.main import main
from memdoc.importers import load_any
from memdoc.trace import EventKind, load_trace
from tests.conftest import run_memdoc
from tests.importers.snapshot_dicts import OOM_SNAPSHOT, SMI_XML, fragmented_snapshot, write_pickle


def _memdoc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, bytes]:
    """memdoc's own entry point in this process: exit code and stderr."""
    code = main(list(args))
    return code, capsys.readouterr().err.encode()


def _one_error_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if not line.startswith("memdoc: hint:")]
    assert len(lines) == 1, text
    assert lines[0].startswith("memdoc: error: ")
    return lines[0]


def test_import_writes_a_trace_that_reads_back_the_same(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    snapshot = write_pickle(tmp_path / "in" / "s.pickle", fragmented_snapshot())
    out = tmp_path / "out" / "run.memdoc"
    out.parent.mkdir()

    done = run_memdoc("import", str(snapshot), "-o", str(out))

    assert done.returncode == 0, done.stderr
    assert b"wrote" in done.stdout
    written = load_trace(out)
    in_memory = load_any([snapshot]).primary
    for key in in_memory.series_keys():
        mine = in_memory.series(key.metric, key.device, key.pid)
        theirs = written.series(key.metric, key.device, key.pid)
        assert theirs is not None and mine is not None
        assert list(theirs.values) == list(mine.values)
    (event,) = written.events(EventKind.SNAPSHOT)
    assert event.data["path"] == os.path.join("..", "in", "s.pickle")  # relative to the trace
    assert [e.kind for e in written.oom_events()] == ["oom"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.memdoc"]  # no temp files


def test_an_existing_output_is_kept_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.memdoc"
    out.write_text("mine")

    code, stderr = _memdoc(capsys, "import", str(OOM_SNAPSHOT), "-o", str(out))
    assert code == 2
    assert "exists" in _one_error_line(stderr)
    assert out.read_text() == "mine"

    code, _ = _memdoc(capsys, "import", str(OOM_SNAPSHOT), "-o", str(out), "--force")
    assert code == 0
    assert load_trace(out).header.mode == "import"


def test_a_hostile_pickle_exits_2_in_one_line_runs_nothing_and_writes_nothing(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, ...]:
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "snapshot.pickle"
    evil.write_bytes(pickle.dumps({"segments": [Evil()]}))
    out = tmp_path / "run.memdoc"

    done = run_memdoc("import", str(evil), "-o", str(out))

    assert done.returncode == 2
    assert "refused" in _one_error_line(done.stderr)
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot.pickle"]


def test_a_failure_after_good_files_leaves_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(2048))
    out = tmp_path / "run.memdoc"
    code, stderr = _memdoc(capsys, "import", str(OOM_SNAPSHOT), str(junk), "-o", str(out))
    assert code == 2
    assert "not a file memdoc can read" in _one_error_line(stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.bin"]


def test_a_snapshot_and_an_nvidia_smi_log_become_one_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.memdoc"
    code, stderr = _memdoc(
        capsys, "import", str(OOM_SNAPSHOT), str(SMI_XML / "rtx-3080-v13.xml"), "-o", str(out)
    )
    assert code == 0, stderr
    trace = load_trace(out)
    assert trace.series("torch.reserved", 0) is not None
    assert trace.series("gpu.used", 0) is not None
    assert trace.devices()[0].name == "NVIDIA GeForce RTX 3080"


def test_missing_inputs_and_output_folders_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stderr = _memdoc(capsys, "import", str(tmp_path / "no.pickle"), "-o", str(tmp_path / "t"))
    assert code == 2
    assert "no such file" in _one_error_line(stderr)
    code, stderr = _memdoc(capsys, "import", str(OOM_SNAPSHOT), "-o", str(tmp_path / "x" / "t"))
    assert code == 2
    assert "does not exist" in _one_error_line(stderr)


def test_a_csv_log_without_header_needs_its_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "smi.csv"
    log.write_text(
        "2025/01/02 10:00:00.000, 0, 1000, 24576\n2025/01/02 10:00:01.000, 0, 1500, 24576\n"
    )
    out = tmp_path / "run.memdoc"

    code, stderr = _memdoc(capsys, "import", str(log), "-o", str(out))
    assert code == 2
    assert b"--columns" in stderr
    columns = "timestamp,index,memory.used,memory.total"
    code, stderr = _memdoc(capsys, "import", str(log), "-o", str(out), "--columns", columns)
    assert code == 0, stderr
    used = load_trace(out).series("gpu.used", 0)
    assert used is not None and list(used.values) == [1000 * 2**20, 1500 * 2**20]
