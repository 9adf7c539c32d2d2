"""A disk that fills up, and an output folder that cannot be written: the program never pays."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_memdoc

PROGRAM = (
    "import sys, time\n"
    "for i in range(30):\n"
    "    print('line', i, flush=True)\n"
    "    time.sleep(0.1)\n"
    "print('done', file=sys.stderr)\n"
)
RAN_MARKER = "program-ran"
MARKING_PROGRAM = f"open({RAN_MARKER!r}, 'w').close()\nprint('ran')\n"


def _mount_tmpfs(where: Path, options: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.decode(errors='replace').strip()}")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "size=64k")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "ro"
    _mount_tmpfs(disk, "ro,size=64k")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave_bytes: int) -> None:
    """Take the disk's space but `leave_bytes`."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave_bytes))


def _plain(folder: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "prog.py"], cwd=folder, capture_output=True, timeout=60)


@pytest.mark.parametrize(
    "leave_bytes",
    [pytest.param(8192, id="fills-up-while-running"), pytest.param(0, id="full-from-the-start")],
)
def test_a_full_disk_stops_the_trace_with_a_warning_and_the_program_runs_on_unchanged(
    tmp_path: Path, tiny_disk: Path, leave_bytes: int
) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    _fill(tiny_disk, leave_bytes)

    plain = _plain(tmp_path)
    watched = run_memdoc(
        "run",
        "-q",
        "--interval",
        "0.01",
        "-o",
        str(tiny_disk / "t.memdoc"),
        "prog.py",
        cwd=tmp_path,
    )

    assert watched.returncode == plain.returncode == 0
    assert watched.stdout == plain.stdout
    warnings = watched.stderr.decode().replace(plain.stderr.decode(), "", 1).splitlines()
    assert len(warnings) == 1, watched.stderr
    assert warnings[0].startswith("memdoc: warning: ") and "No space left" in warnings[0]
    assert "trace stops" in warnings[0]


def test_a_trace_stopped_by_a_full_disk_opens_with_what_was_written(
    tmp_path: Path, tiny_disk: Path
) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    _fill(tiny_disk, 8192)

    run_memdoc(
        "run",
        "-q",
        "--interval",
        "0.01",
        "-o",
        str(tiny_disk / "t.memdoc"),
        "prog.py",
        cwd=tmp_path,
    )
    (tiny_disk / "filler").unlink()
    said = run_memdoc("diagnose", str(tiny_disk / "t.memdoc"), cwd=tmp_path)

    assert said.returncode in (0, 3), said.stderr
    assert b"Traceback" not in said.stderr


@pytest.mark.parametrize(
    ("where", "says"),
    [
        pytest.param("read-only", b"not writable", id="read-only-folder"),
        pytest.param("missing", b"does not exist", id="missing-folder"),
    ],
)
def test_an_unwritable_trace_folder_is_refused_before_the_program_starts(
    tmp_path: Path, read_only_disk: Path, where: str, says: bytes
) -> None:
    (tmp_path / "prog.py").write_text(MARKING_PROGRAM)
    folder = read_only_disk if where == "read-only" else tmp_path / "no" / "such" / "folder"

    said = run_memdoc("run", "-o", str(folder / "t.memdoc"), "prog.py", cwd=tmp_path)

    # The trace was asked for: running the job without it would waste the job.
    assert said.returncode == 2
    assert said.stderr.decode().startswith("memdoc: error: ") and says in said.stderr
    assert b"Traceback" not in said.stderr
    assert said.stdout == b""
    assert not (tmp_path / RAN_MARKER).exists()


@pytest.mark.parametrize("command", ["report", "import"])
def test_an_unwritable_output_folder_is_refused_by_report_and_import(
    tmp_path: Path, read_only_disk: Path, command: str
) -> None:
    (tmp_path / "prog.py").write_text("print('hi')\n")
    run_memdoc("run", "-q", "-o", "t.memdoc", "prog.py", cwd=tmp_path)
    source = "t.memdoc"
    if command == "import":
        source = str(tmp_path / "log.csv")
        Path(source).write_text(
            "timestamp, index, memory.used [MiB], memory.total [MiB]\n"
            "2024/01/01 00:00:00.000, 0, 100 MiB, 81920 MiB\n"
        )

    said = run_memdoc(command, source, "-o", str(read_only_disk / "out"), cwd=tmp_path)

    assert said.returncode == 2
    assert said.stderr.decode().startswith("memdoc: error: ") and b"not writable" in said.stderr
    assert os.listdir(read_only_disk) == []


WATCH_PROGRAM = (
    "import sys, time\n"
    "import memdoc\n"
    "with memdoc.watch(sys.argv[1], interval=0.01, quiet=True):\n"
    "    for i in range(300):\n"
    "        memdoc.step(i=i)\n"
    "        time.sleep(0.005)\n"
    "print('done')\n"
)


@pytest.mark.parametrize(
    "leave_bytes",
    [pytest.param(8192, id="fills-up-while-running"), pytest.param(0, id="full-from-the-start")],
)
def test_a_watch_on_a_full_disk_says_so_once_and_the_block_runs_on(
    tmp_path: Path, tiny_disk: Path, leave_bytes: int
) -> None:
    (tmp_path / "prog.py").write_text(WATCH_PROGRAM)
    _fill(tiny_disk, leave_bytes)
    env = dict(os.environ)
    env.pop("MEMDOC_AGENT", None)

    done = subprocess.run(
        [sys.executable, "prog.py", str(tiny_disk / "w.memdoc")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout == b"done\n"
    warnings = [line for line in done.stderr.decode().splitlines() if "No space left" in line]
    assert len(warnings) == 1, done.stderr.decode()
    assert warnings[0].startswith("memdoc: warning: ") and "w.memdoc" in warnings[0]
    assert b"Traceback" not in done.stderr
