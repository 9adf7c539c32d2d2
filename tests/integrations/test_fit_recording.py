"""What every framework callback shares: fresh trace names, a fit that cannot be recorded,
and the Lightning it subclasses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.api import default_trace_path
from memdoc.integrations.fit import FitRecording


def test_default_trace_names_never_reuse_an_existing_file(tmp_path: Path) -> None:
    first = default_trace_path(tmp_path, tag="keras")
    first.write_text("taken")

    second = default_trace_path(tmp_path, tag="keras")

    assert second != first
    assert second.name.startswith("memdoc-keras-") and second.suffix == ".memdoc"
    assert first.read_text() == "taken"


def test_a_fit_that_cannot_be_recorded_runs_unobserved_and_claims_no_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-folder" / "fit.memdoc"
    recording = FitRecording("keras", missing, interval_s=0.05)

    recording.start()
    recording.step()
    recording.mark("epoch", epoch=1)
    recording.finish(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))

    err = capsys.readouterr().err
    assert not recording.active
    assert recording.path is None and recording.summary is None and recording.diagnosis is None
    assert err.count("cannot record to") == 1 and "runs unobserved" in err
    assert "trace written" not in err and "no summary" not in err
    assert not missing.parent.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "package",
    [pytest.param("lightning.pytorch", id="lightning"), pytest.param("pytorch_lightning", id="pl")],
)
def test_lightning_callback_subclasses_the_package_the_program_imported(package: str) -> None:
    code = (
        f"import {package} as pl\n"
        "from memdoc.integrations.lightning import MemdocCallback\n"
        "assert issubclass(MemdocCallback, pl.Callback), MemdocCallback.__mro__\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-2000:]


def test_a_watch_left_open_at_exit_leaves_no_recording_announced(tmp_path: Path) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("MEMDOC_AGENT", None)
    code = (
        "import memdoc, tempfile, pathlib\n"
        "memdoc.watch('w.memdoc', quiet=True).__enter__()\n"
        "folder = pathlib.Path(tempfile.gettempdir())\n"
        "print(len(list(folder.rglob('*.json'))))\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, timeout=60
    )

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b"1\n"  # announced while it ran
    assert list(temp.rglob("*.json")) == []
