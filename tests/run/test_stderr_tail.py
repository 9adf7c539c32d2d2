"""`memdoc run` reads memory errors from the end of the program's stderr (TensorFlow's BFC
dump, XLA's buffer assignment) while the program writes to its real stderr: a file stays a
file, a pipe a pipe, a terminal a terminal."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from memdoc.trace import load_trace
from memdoc.trace.model import EventKind
from tests.conftest import FIXTURES, memdoc_cmd

BFC_DUMP = FIXTURES / "oom-messages" / "tf-cpu-bfc-dump.txt"
# Prints a real TensorFlow BFC allocator dump (recorded from TF on CPU) as TF's C++ logging
# does: straight to fd 2, not through sys.stderr. Then says what its fd 2 is.
PROGRAM = f"""
import os, stat, sys
mode = os.fstat(2).st_mode
kind = "tty" if os.isatty(2) else "file" if stat.S_ISREG(mode) else "pipe"
print("stderr is a", kind, flush=True)
os.write(2, open({str(BFC_DUMP)!r}, "rb").read())
sys.exit(3)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "MEMDOC_AGENT"}


def _stderr_ooms(trace_path: Path) -> list[dict[str, object]]:
    events = load_trace(trace_path).events(EventKind.OOM)
    return [dict(e.data) for e in events if e.data.get("source") == "stderr"]


@pytest.mark.parametrize("target", ["file", "pipe"])
def test_a_bfc_dump_on_stderr_is_recorded_and_the_program_keeps_its_kind_of_stderr(
    tmp_path: Path, target: str
) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    cmd = memdoc_cmd("run", "-q", "-o", "t.memdoc", "prog.py")
    if target == "file":
        with open(tmp_path / "err.txt", "wb") as err:
            done = subprocess.run(
                cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=err, timeout=120
            )
        stderr = (tmp_path / "err.txt").read_bytes()
    else:
        done = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, timeout=120)
        stderr = done.stderr

    assert done.returncode == 3
    assert done.stdout == f"stderr is a {target}\n".encode()
    assert stderr == BFC_DUMP.read_bytes()  # byte for byte, nothing added
    (oom,) = _stderr_ooms(tmp_path / "t.memdoc")
    assert oom["oom"]["framework"] == "tensorflow"  # type: ignore[index]
    assert "BFCAllocator dump" in str(oom["dump"])


def test_a_terminal_stays_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            memdoc_cmd("run", "-q", "-o", "t.memdoc", "prog.py"),
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=120,
        )
    finally:
        os.close(follower)
        os.close(leader)

    assert done.returncode == 3
    assert done.stdout == b"stderr is a tty\n"


def test_with_stderr_to_a_pipe_memdocs_only_child_is_still_the_program(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(
        "import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(30)\n"
    )
    memdoc = subprocess.Popen(
        memdoc_cmd("run", "-q", "-o", "t.memdoc", "prog.py"),
        cwd=tmp_path,
        env=_env(),
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not ((tmp_path / "pid").exists() and (tmp_path / "pid").read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        children = [p.pid for p in psutil.Process(memdoc.pid).children()]
        assert children == [int((tmp_path / "pid").read_text())]
    finally:
        os.killpg(memdoc.pid, signal.SIGKILL)
        memdoc.communicate(timeout=30)
