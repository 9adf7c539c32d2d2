"""`memdoc headroom`'s probes, attacked: planted links in the folder kept, programs that never
step, predictions far beyond what was measured, probes that hang, a headroom that is
terminated, and the temporary folders of every search."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import memdoc_cmd, run_memdoc

NOBODY_UID = 65534
VICTIM_TEXT = "the victim's own file\n"

# Holds SIZE MiB during each step, under an address-space cap of 1 GiB more than it maps at the
# start, and reports each step with memdoc.step().
STEPPING = """
import resource, sys, time
import memdoc
size = int(sys.argv[1])
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))
for step in range(50):
    block = b"x" * (size << 20)  # touched: resident, not only mapped
    time.sleep(0.05)
    memdoc.step()
    del block
"""
# Never reports a step, and ends at once.
NO_STEP = "import sys\nprint('batch', sys.argv[1])\n"
# Writes its pid and its parent's (memdoc run's), then sleeps without stepping.
HANGS = """
import os, sys, time
from pathlib import Path
Path(sys.argv[2]).write_text(f"{os.getpid()} {os.getppid()}")
time.sleep(600)
"""


def _program(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _environment(tmp_path: Path) -> dict[str, str]:
    """A temporary folder of the test's own, to see what a search leaves in it."""
    temp = tmp_path / "temp"
    temp.mkdir(exist_ok=True)
    return {"TMPDIR": str(temp)}


def _left_in_temp(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "temp").iterdir() if p.name.startswith("memdoc-hr"))


def _gone(pid: int, within_s: float = 15.0) -> bool:
    """True once `pid` has ended (a zombie waiting for its parent counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _pids(path: Path, within_s: float = 60.0) -> tuple[int, int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if len(text.split()) == 2:
            program, memdoc_run = text.split()
            return int(program), int(memdoc_run)
        time.sleep(0.05)
    raise AssertionError("the program never started")


def _kill(pid: int) -> None:
    """Leave nothing running behind a failed test."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_keep_never_writes_a_probe_log_through_another_users_link(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a link owned by another user needs root")
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    link = shared / "size-8.log"
    link.symlink_to(victim)
    os.lchown(link, NOBODY_UID, NOBODY_UID)
    program = _program(tmp_path, "train.py", STEPPING)

    done = run_memdoc(
        "headroom", "--keep", str(shared), "--sizes", "8,16", "--", sys.executable,
        str(program), "{}", env=_environment(tmp_path),
    )  # fmt: skip

    assert victim.read_text() == VICTIM_TEXT
    assert done.returncode == 2
    err = done.stderr.decode()
    assert err.splitlines()[0].startswith("memdoc: error: ")
    assert "symbolic link owned by another user" in err
    assert "Traceback" not in err


def test_keep_creates_a_folder_that_does_not_exist_yet(tmp_path: Path) -> None:
    program = _program(tmp_path, "train.py", STEPPING)
    kept = tmp_path / "runs" / "hr"

    done = run_memdoc(
        "headroom", "--keep", f"{kept}/", "--sizes", "4,8", "--steps", "2", "--refine", "0",
        "--", sys.executable, str(program), "{}", env=_environment(tmp_path),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr.decode()
    assert sorted(p.name for p in kept.iterdir()) == [
        "size-4.log",
        "size-4.memdoc",
        "size-8.log",
        "size-8.memdoc",
    ]


def test_keep_refuses_a_path_that_is_a_file(tmp_path: Path) -> None:
    program = _program(tmp_path, "train.py", STEPPING)
    not_a_folder = tmp_path / "hr"
    not_a_folder.write_text("a file\n")

    done = run_memdoc(
        "headroom", "--keep", str(not_a_folder), "--sizes", "4,8", "--", sys.executable,
        str(program), "{}", env=_environment(tmp_path),
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.decode().splitlines()[0].startswith("memdoc: error: cannot write in")
    assert not_a_folder.read_text() == "a file\n"


def test_a_program_that_never_reports_a_step_gets_one_line_and_no_answer(
    tmp_path: Path,
) -> None:
    program = _program(tmp_path, "train.py", NO_STEP)
    kept = tmp_path / "hr"

    done = run_memdoc(
        "headroom", "--keep", str(kept), "--sizes", "8,16,32", "--json", "--",
        sys.executable, str(program), "{}", env=_environment(tmp_path),
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stdout == b""
    first = done.stderr.decode().splitlines()[0]
    assert first == (
        "memdoc: error: size 8: the program reported no training step, so there is no "
        "per-step peak to fit; nothing was answered"
    )
    # It stopped at the first size: nothing larger was tried.
    assert sorted(p.name for p in kept.iterdir()) == ["size-8.log", "size-8.memdoc"]


def test_no_probe_is_far_beyond_the_largest_size_that_trained(tmp_path: Path) -> None:
    # 1 and 2 MiB a step under a 1 GiB cap: the line says hundreds; memdoc walks up to it.
    program = _program(tmp_path, "train.py", STEPPING)

    done = run_memdoc(
        "headroom", "--sizes", "1,2", "--steps", "2", "--refine", "2", "--margin", "0",
        "--json", "--", sys.executable, str(program), "{}", env=_environment(tmp_path),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr.decode()
    probed = [p["size"] for p in json.loads(done.stdout)["probes"]]
    assert probed[:2] == [1, 2]
    # One or two refinements (`--refine 2`): the second stops when its candidate was probed.
    assert len(probed) in (3, 4)
    for i, size in enumerate(probed[2:], start=2):
        trained = probed[:i]
        assert size <= 4 * max(trained), f"probed {size} after only {trained} trained"


def test_a_probe_past_its_timeout_is_ended_with_its_whole_process_group(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    program = _program(tmp_path, "train.py", HANGS)

    done = run_memdoc(
        "headroom", "--timeout", "3", "--sizes", "8,16", "--", sys.executable, str(program),
        "{}", str(pids), env=_environment(tmp_path), timeout=60,
    )  # fmt: skip

    program_pid, memdoc_run_pid = _pids(pids)
    try:
        assert done.returncode == 2
        first = done.stderr.decode().splitlines()[0]
        assert first == "memdoc: error: size 8: still running after 3 s; its run was ended"
        assert _gone(program_pid), "the program was left running"
        assert _gone(memdoc_run_pid), "the probe's memdoc run was left running"
        assert _left_in_temp(tmp_path) == []
    finally:
        _kill(program_pid)
        _kill(memdoc_run_pid)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_terminated_headroom_ends_the_probe_it_was_running(
    tmp_path: Path, signum: signal.Signals
) -> None:
    pids = tmp_path / "pids"
    program = _program(tmp_path, "train.py", HANGS)
    env = {k: v for k, v in os.environ.items() if k != "MEMDOC_AGENT"}
    env.update(_environment(tmp_path))
    headroom = subprocess.Popen(
        memdoc_cmd("headroom", "--sizes", "8,16", "--", sys.executable, str(program), "{}")
        + [str(pids)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        program_pid, memdoc_run_pid = _pids(pids)
        headroom.send_signal(signum)
        _, err = headroom.communicate(timeout=30)
        assert _gone(program_pid), "the program was left running"
        assert _gone(memdoc_run_pid), "the probe's memdoc run was left running"
        assert headroom.returncode == (-signum if signum == signal.SIGTERM else 130)
        assert b"Traceback" not in err
        assert _left_in_temp(tmp_path) == []
    finally:
        headroom.kill()
        headroom.wait()
        if pids.exists():
            for pid in _pids(pids):
                _kill(pid)


def test_a_search_leaves_no_temporary_folder_behind(tmp_path: Path) -> None:
    stepping = _program(tmp_path, "train.py", STEPPING)
    no_step = _program(tmp_path, "idle.py", NO_STEP)
    env = _environment(tmp_path)

    answered = run_memdoc(
        "headroom", "--sizes", "4,8", "--steps", "2", "--refine", "0", "--", sys.executable,
        str(stepping), "{}", env=env,
    )  # fmt: skip
    refused = run_memdoc(
        "headroom", "--sizes", "4,8", "--", sys.executable, str(no_step), "{}", env=env
    )

    assert answered.returncode == 0, answered.stderr.decode()
    assert refused.returncode == 2
    assert _left_in_temp(tmp_path) == []
