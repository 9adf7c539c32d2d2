"""memdoc's own failures (a killed or stopped parent, leftovers of a killed run) never stop or
slow the program it watches. Real processes, real signals, real files and pipes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from memdoc.run.channel import MAX_QUEUED
from memdoc.trace import load_trace
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


def _program_of(memdoc: subprocess.Popen[bytes], script: str) -> psutil.Process:
    """The program memdoc runs (not the stderr copier it may start first)."""
    parent = psutil.Process(memdoc.pid)

    def program() -> psutil.Process | None:
        for child in parent.children():
            with contextlib.suppress(psutil.Error):
                if child.cmdline()[1:] == [script]:
                    return child
        return None

    _wait_until(lambda: program() is not None)
    found = program()
    assert found is not None
    return found


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


@pytest.fixture
def short_tmpdir() -> Iterator[Path]:
    """A private temporary folder with a short path, so that the run folders made in it
    hold their socket there (pytest-xdist's worker folders are too deep for one)."""
    folder = Path(tempfile.mkdtemp(prefix="memdoc-test-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_runs_folder_is_removed_at_the_next_start_and_a_live_runs_is_kept(
    tmp_path: Path, short_tmpdir: Path
) -> None:
    tmpdir = short_tmpdir
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "quick.py").write_text("print('done')\n")
    env = _env(tmpdir)
    foreign = tmpdir / "memdoc-run-1-someone"  # PID 1 is alive: it must be left alone
    foreign.mkdir()
    # GIVEN a run that goes on
    with _started(
        memdoc_cmd("run", "-q", "-o", "live.memdoc", "sleeper.py"), cwd=tmp_path, env=env
    ) as live:
        _program_of(live, "sleeper.py")
        _wait_until(lambda: len(_run_dirs(tmpdir)) == 2)
        (live_dir,) = _run_dirs(tmpdir) - {foreign}
        # AND a run killed with SIGKILL: its folder (with the agents' socket) stays behind
        with _started(
            memdoc_cmd("run", "-q", "-o", "killed.memdoc", "sleeper.py"), cwd=tmp_path, env=env
        ) as killed:
            _program_of(killed, "sleeper.py")
            _wait_until(lambda: len(_run_dirs(tmpdir)) == 3)
            (left,) = _run_dirs(tmpdir) - {foreign, live_dir}
            killed.kill()
            killed.wait(timeout=10)
        assert left.is_dir()
        # AND a live run in another PID namespace (containers sharing /tmp): its PID means
        # nothing here, but it listens on its socket
        elsewhere = tmpdir / f"memdoc-run-{killed.pid}-elsewhere"
        elsewhere.mkdir()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(elsewhere / "agent.sock"))
        listener.listen(8)
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
        assert (elsewhere / "agent.sock").exists()
        listener.close()
        assert live.poll() is None


# Steps too, so its agent keeps sending to the dead memdoc; and dies of SIGPIPE as command-line
# tools often choose to, so a send that raised SIGPIPE would kill it.
TALKER = """
import os, signal, sys, time
import memdoc
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
with open("running", "w") as f:
    f.write(str(os.getpid()))
for i in range(LINES):
    print(f"line {i}", file=sys.stderr, flush=True)
    memdoc.step()
    time.sleep(0.01)
print("done", flush=True)
"""
LINES = 250

# Runs `memdoc run` with its stderr sent to a file or a pipe, SIGKILLs memdoc while the program
# writes, and reports how the program ended. As a child subreaper it becomes the parent of the
# orphaned program, so it can wait for the program's own exit status.
DRIVER = """
import ctypes, json, os, subprocess, sys, threading, time
mode = sys.argv[1]
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
cmd = [sys.executable, "-m", "memdoc", "run", "-q", "-o", "t.memdoc", "talker.py"]
out = open("out.txt", "wb")
if mode == "file":
    memdoc = subprocess.Popen(cmd, stdout=out, stderr=open("err.txt", "wb"))
elif mode == "pipe":
    memdoc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
else:
    memdoc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
stream = memdoc.stdout if mode == "same-pipe" else memdoc.stderr
got = []
reader = threading.Thread(target=lambda: got.append(stream.read()) if stream else None)
reader.start()
while not os.path.exists("running") or not open("running").read():
    time.sleep(0.01)
program = int(open("running").read())
time.sleep(0.6)
memdoc.kill()
memdoc.wait()
status = None
while True:
    try:
        pid, raw = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    if pid == program:
        status = os.waitstatus_to_exitcode(raw)
reader.join()
text = got[0] if got and got[0] else open("err.txt", "rb").read() if mode == "file" else b""
print(json.dumps({"status": status, "stderr": text.decode(), "memdoc": memdoc.returncode}))
"""


@pytest.mark.parametrize("mode", ["file", "pipe", "same-pipe"])
def test_the_program_goes_on_with_all_its_output_when_memdoc_is_killed(
    tmp_path: Path, mode: str
) -> None:
    (tmp_path / "talker.py").write_text(TALKER.replace("LINES", str(LINES)))
    (tmp_path / "driver.py").write_text(DRIVER)

    done = subprocess.run(
        [sys.executable, "driver.py", mode],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["memdoc"] == -signal.SIGKILL  # memdoc died mid-run
    assert result["status"] == 0  # the program did not
    lines = [x for x in result["stderr"].splitlines() if x.startswith("line ")]
    assert lines == [f"line {i}" for i in range(LINES)]
    if mode == "same-pipe":
        assert result["stderr"].splitlines()[-1] == "done"
    else:
        assert (tmp_path / "out.txt").read_text() == "done\n"


STEPPER = """
import json, os, sys, time
import memdoc
with open("running", "w") as f:
    f.write(str(os.getpid()))
steps, burst_s = 0, 0.0
start = time.perf_counter()
end = start + RUN_S
while time.perf_counter() < end:
    memdoc.step()
    steps += 1
    until = time.perf_counter() + 20e-6  # a short step: tens of thousands a second
    while time.perf_counter() < until:
        pass
    # Once memdoc is stopped, a burst of steps overfills its queue however loaded the
    # machine is (at the steady rate, a loaded machine may not step 10,000 times in 3 s).
    if not burst_s and steps % 512 == 0 and os.path.exists("stopped"):
        burst_start = time.perf_counter()
        for _ in range(BURST):
            memdoc.step()
        burst_s = time.perf_counter() - burst_start
steady_s = time.perf_counter() - start - burst_s
print(json.dumps({"steps_per_s": steps / steady_s}), flush=True)
"""
RUN_S = 8.0  # the stop ends at about 4 s: the rest shows the agent back under any load
STOP_S = 3.0
BURST = 3 * MAX_QUEUED  # steps back to back while stopped: more than the queue and socket hold


def _start_stepper(folder: Path) -> subprocess.Popen[bytes]:
    folder.mkdir()
    program = STEPPER.replace("RUN_S", str(RUN_S)).replace("BURST", str(BURST))
    (folder / "stepper.py").write_text(program)
    return subprocess.Popen(
        memdoc_cmd("run", "-q", "-o", "t.memdoc", "stepper.py"),
        cwd=folder,
        env=_env(folder),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def _steps_per_s(memdoc: subprocess.Popen[bytes]) -> float:
    """The program's steady step rate (the burst aside)."""
    out, _ = memdoc.communicate(timeout=120)
    assert memdoc.returncode == 0
    return float(json.loads(out)["steps_per_s"])


def test_a_stopped_memdoc_never_slows_the_program_and_the_trace_says_what_was_lost(
    tmp_path: Path,
) -> None:
    # GIVEN two runs of a program that steps for 8 s, side by side (the same machine load)
    plain, stopped = _start_stepper(tmp_path / "plain"), _start_stepper(tmp_path / "stopped")
    try:
        running = [tmp_path / name / "running" for name in ("plain", "stopped")]
        _wait_until(lambda: all(r.exists() and r.read_text() for r in running))
        pid = int(running[1].read_text())
        time.sleep(1.0)
        # WHEN one memdoc is stopped (SIGSTOP) for 3 s, then resumed
        stopped_unix = time.time()
        stopped.send_signal(signal.SIGSTOP)
        (tmp_path / "stopped" / "stopped").touch()
        time.sleep(STOP_S)
        resumed_unix = time.time()
        stopped.send_signal(signal.SIGCONT)
        plain_rate, stopped_rate = _steps_per_s(plain), _steps_per_s(stopped)
    finally:
        for memdoc in (plain, stopped):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(memdoc.pid, signal.SIGKILL)
            memdoc.wait(timeout=30)

    # THEN its program stepped as fast as the other (waiting 3 s of 8 would cut its rate)
    assert stopped_rate > 0.8 * plain_rate, (plain_rate, stopped_rate)
    trace = load_trace(tmp_path / "stopped" / "t.memdoc")
    created = trace.header.created_unix
    # AND the agent came back after the stop: steps after the resume are in the trace
    assert any(e.t > resumed_unix - created + 0.2 for e in trace.steps())
    # AND the trace records what the agent dropped, from which process, and when
    losses = [loss for loss in trace.losses() if loss.pid == pid]
    assert losses and sum(loss.samples + loss.events for loss in losses) > 0
    assert min(loss.start_s for loss in losses) < resumed_unix - created
    assert max(loss.end_s for loss in losses) > stopped_unix - created
    # AND diagnose warns about it
    diagnosed = subprocess.run(
        memdoc_cmd("diagnose", "t.memdoc"),
        cwd=tmp_path / "stopped",
        env=_env(tmp_path),
        capture_output=True,
        timeout=120,
    )
    assert diagnosed.returncode == 0, diagnosed.stderr
    said = " ".join(diagnosed.stdout.decode().split())
    assert f"events from PID {pid} were lost between" in said
    assert "while memdoc could not keep up" in said
