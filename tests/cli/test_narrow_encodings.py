"""Output to a stream that cannot encode every character (PYTHONIOENCODING=ascii, a latin-1
terminal): memdoc degrades what it prints to what the stream can encode, and never fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_memdoc
from tests.report.traces import write_oom_run

OOM_TEXT = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 226.00 MiB. GPU 0 has a "
    "total capacity of 15.60 GiB of which 71.19 MiB is free. Process 4242 has 15.52 GiB "
    "memory in use. Of the allocated memory 13.61 GiB is allocated by PyTorch, and 67.22 "
    "MiB is reserved by PyTorch but unallocated."
)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("diagnose", "run.memdoc"), id="diagnose"),
        pytest.param(("explain", "crash.log"), id="explain"),
        pytest.param(("rules", "fragmentation"), id="rules"),
    ],
)
def test_output_degrades_to_what_the_stream_can_encode(
    tmp_path: Path, encoding: str, command: tuple[str, ...]
) -> None:
    write_oom_run(tmp_path / "run.memdoc")
    (tmp_path / "crash.log").write_text(OOM_TEXT)

    done = run_memdoc(*command, cwd=tmp_path, env={"PYTHONIOENCODING": encoding})

    assert done.returncode in (0, 3), done.stderr.decode(errors="replace")
    assert b"memdoc failed" not in done.stderr and b"Traceback" not in done.stderr
    text = done.stdout.decode(encoding)
    assert len(text.splitlines()) > 3
    assert "\\u" not in text and "\\x" not in text  # degraded to look-alikes, not escapes


def test_the_end_of_run_summary_degrades_too(tmp_path: Path) -> None:
    # Long enough for the parent to sample the host once: the summary then gives the peak.
    (tmp_path / "prog.py").write_text("import time\ntime.sleep(0.5)\nprint('ok')\n")

    done = run_memdoc(
        "run", "-o", "t.memdoc", "prog.py", cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"}
    )

    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout == b"ok\n"
    said = done.stderr.decode("ascii")
    assert said.startswith("memdoc: peak host") and "t.memdoc" in said
