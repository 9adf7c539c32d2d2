"""No memdoc call raises into the program for memdoc's own reasons: whatever it is given,
under `memdoc run`, under `memdoc.watch`, or with no session at all, the program goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.trace import load_trace
from tests.conftest import run_memdoc

CALLS = """
import memdoc

class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")

def calls(w=None):
    memdoc.step(source="loader")
    memdoc.step(step=3, source="loader", loss=Unprintable())
    memdoc.step(**{"data": 1, "kind": "x", "t": 2, "pid": 3})
    memdoc.mark("eval", snapshot=True, source="x", step=4)
    memdoc.mark(Unprintable())
    memdoc.mark("epoch", **{"label2": float("nan"), "data": object()})
    if w is not None:
        w.step(source="loader", step=9)
        w.mark("phase", label2=1, snapshot=True)
        w.mark(Unprintable())
"""
UNDER_RUN = CALLS + "calls()\nprint('survived')\n"
UNDER_WATCH = (
    CALLS
    + """
import sys
with memdoc.watch(sys.argv[1], quiet=True) as w:
    calls(w)
print('survived')
"""
)


def _user_steps(path: Path) -> list[object]:
    return [e.data.get("source") for e in load_trace(path).steps()]


def test_public_calls_with_any_arguments_under_memdoc_run_leave_the_program_running(
    tmp_path: Path,
) -> None:
    (tmp_path / "prog.py").write_text(UNDER_RUN)

    done = run_memdoc("run", "-q", "-o", "t.memdoc", "prog.py", cwd=tmp_path, timeout=60)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b"survived\n"
    assert b"Traceback" not in done.stderr
    assert _user_steps(tmp_path / "t.memdoc") == ["user", "user", "user"]


def test_public_calls_with_any_arguments_under_watch_leave_the_program_running(
    tmp_path: Path,
) -> None:
    (tmp_path / "prog.py").write_text(UNDER_WATCH)
    env = dict(os.environ)
    env.pop("MEMDOC_AGENT", None)

    done = subprocess.run(
        [sys.executable, "prog.py", "w.memdoc"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b"survived\n"
    assert b"Traceback" not in done.stderr
    assert _user_steps(tmp_path / "w.memdoc") == ["user"] * 4


@pytest.mark.parametrize("setting", ["run", "none"])
def test_a_step_keeps_its_own_number_and_source_whatever_the_program_names_its_data(
    tmp_path: Path, setting: str
) -> None:
    (tmp_path / "prog.py").write_text(
        "import memdoc\nfor _ in range(3):\n    memdoc.step(step=99, source='loader')\n"
    )
    if setting == "none":
        done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True)
        assert done.returncode == 0 and done.stderr == b""
        return
    done = run_memdoc("run", "-q", "-o", "t.memdoc", "prog.py", cwd=tmp_path, timeout=60)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    steps = load_trace(tmp_path / "t.memdoc").steps()
    assert [e.data["step"] for e in steps] == [1, 2, 3]
    assert {e.data["user_step"] for e in steps} == {99}
    assert {e.data["user_source"] for e in steps} == {"loader"}
