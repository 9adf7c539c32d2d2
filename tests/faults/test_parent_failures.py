"""memdoc's own failures (a killed or stopped parent, leftovers of a killed run) never stop or
slow the program it watches. Real processes, real signals, real files and pipes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from tests.conftest import memdoc_cmd


def _env(tmpdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MEMDOC_AGENT"}
    env["TMPDIR"] = str(tmpdir)  # where run folders go: one private to the test
    return env


def _run_dirs(tmpdir: Path) -> set[Path]:
    return set(tmpdir.glob("memdoc-run-*"))


def _wait_until(condition: object, timeout_s: float = 30.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _program_of(memdoc: subprocess.Popen[bytes]) -> psutil.Process:
    parent = psutil.Process(memdoc.pid)
    _wait_until(lambda: parent.children())
    return parent.children()[0]


@contextlib.contextmanager
def _started(cmd: list[str], **kwargs: object) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


SLEEPER = "import time\nwhile True:\n    time.sleep(0.05)\n"


def test_a_killed_runs_folder_is_removed_at_the_next_start_and_a_live_runs_is_kept(
    tmp_path: Path,
) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "quick.py").write_text("print('done')\n")
    env = _env(tmpdir)
    foreign = tmpdir / "memdoc-run-1-someone"  # PID 1 is alive: it must be left alone
    foreign.mkdir()
    # GIVEN a run that goes on
    with _started(
        memdoc_cmd("run", "-q", "-o", "live.memdoc", "sleeper.py"), cwd=tmp_path, env=env
    ) as live:
        _program_of(live)
        _wait_until(lambda: len(_run_dirs(tmpdir)) == 2)
        (live_dir,) = _run_dirs(tmpdir) - {foreign}
        # AND a run killed with SIGKILL: its folder (with the agents' socket) stays behind
        with _started(
            memdoc_cmd("run", "-q", "-o", "killed.memdoc", "sleeper.py"), cwd=tmp_path, env=env
        ) as killed:
            _program_of(killed)
            _wait_until(lambda: len(_run_dirs(tmpdir)) == 3)
            (left,) = _run_dirs(tmpdir) - {foreign, live_dir}
            killed.kill()
            killed.wait(timeout=10)
        assert left.is_dir()
        # AND, as root, a leftover of the same dead PID that belongs to another user
        theirs = tmpdir / f"memdoc-run-{killed.pid}-theirs"
        if os.geteuid() == 0:
            theirs.mkdir()
            os.chown(theirs, 65534, 65534)

        # WHEN a new run starts
        done = subprocess.run(
            memdoc_cmd("run", "-q", "-o", "next.memdoc", "quick.py"),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=60,
        )

        # THEN the leftover is gone, the live run's folder and socket are untouched
        assert done.returncode == 0, done.stderr
        assert not left.exists()
        assert (live_dir / "agent.sock").exists()
        assert foreign.is_dir()
        assert theirs.is_dir() or os.geteuid() != 0
        assert live.poll() is None
