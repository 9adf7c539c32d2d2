"""Hostile pickles given as snapshots: refused in one line, never run, never a partial output."""

from __future__ import annotations

import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_memdoc
from tests.faults.cli_in_process import memdoc

MARKER = "pwned.txt"


def _command(folder: Path) -> str:
    return f"touch {folder / MARKER}"


class _RunsShell:
    """Unpickling it would run a shell command: the classic payload."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


class _Evaluates:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, (f"__import__('os').system({self.command!r})",))


def _snapshot_shaped(payload: object) -> dict[str, object]:
    """What a PyTorch memory snapshot looks like, with the payload deep inside it."""
    return {
        "segments": [
            {
                "device": 0,
                "address": 0,
                "total_size": 2**20,
                "blocks": [{"size": 2**20, "state": payload}],
            }
        ],
        "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "frames": [payload]}]],
    }


def _hostile_pickles(folder: Path) -> dict[str, bytes]:
    command = _command(folder).encode()
    pickles = {
        # Protocol 0, written by hand: GLOBAL os.system, then REDUCE.
        "global-reduce-p0": b"cos\nsystem\n(S'" + command + b"'\ntR.",
        # INST imports and calls in one opcode.
        "inst-p0": b"(S'" + command + b"'\nios\nsystem\n.",
        # OBJ calls a class found by GLOBAL.
        "obj-p1": b"(cos\nsystem\nS'" + command + b"'\no.",
        # BUILD calls __setstate__ of whatever the pickle made.
        "build-setstate": b"cos\nsystem\n)R}b.",
    }
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        pickles[f"reduce-p{protocol}"] = pickle.dumps(
            _RunsShell(_command(folder)), protocol=protocol
        )
        pickles[f"eval-p{protocol}"] = pickle.dumps(_Evaluates(_command(folder)), protocol=protocol)
        shaped = _snapshot_shaped(_RunsShell(_command(folder)))
        pickles[f"inside-a-snapshot-p{protocol}"] = pickle.dumps(shaped, protocol=protocol)
    return pickles


def _broken_pickles() -> dict[str, bytes]:
    plain = pickle.dumps(_snapshot_shaped("fine"), protocol=4)
    return {
        "truncated-snapshot": plain[: len(plain) // 2],
        "not-a-snapshot": pickle.dumps([1, 2, 3], protocol=4),
        "empty": b"",
        "stop-only": b".",
        "memo-get-out-of-range": b"\x80\x04h\xff.",
        "random-bytes": bytes(range(256)) * 8,
    }


def _shared_reference_bombs() -> dict[str, bytes]:
    """Small files whose objects, walked naively, are 2**60 nodes: shared references."""
    segments: object = {"size": 1}
    frames: object = {"frames": [], "size": 1, "action": "alloc", "addr": 1}
    for _ in range(60):
        segments = [segments, segments]
        frames = {"frames": [frames, frames], "size": 1, "action": "alloc", "addr": 1}
    return {
        "segments-bomb": pickle.dumps(
            {"segments": segments, "device_traces": [segments]}, protocol=4
        ),
        "frames-bomb": pickle.dumps({"segments": [], "device_traces": [[frames]]}, protocol=4),
    }


@pytest.mark.parametrize("name", ["segments-bomb", "frames-bomb"])
def test_a_snapshot_of_exponentially_shared_references_is_read_or_refused_at_once(
    tmp_path: Path, name: str
) -> None:
    (tmp_path / "snapshot.pickle").write_bytes(_shared_reference_bombs()[name])

    said = memdoc("import", str(tmp_path / "snapshot.pickle"), "-o", str(tmp_path / "out.memdoc"))

    assert said.status == 0 or said.one_clear_error()


def test_every_hostile_pickle_payload_is_one_that_python_would_run(tmp_path: Path) -> None:
    """The payloads are real: plain pickle.loads would run the command (checked on one)."""
    pickles = _hostile_pickles(tmp_path)
    with open(os.devnull, "w") as sink:
        for data in pickles.values():
            pickletools.dis(data, out=sink)  # well-formed pickles, all of them
    pickle.loads(pickles["global-reduce-p0"])

    assert (tmp_path / MARKER).exists()


@pytest.mark.parametrize("command", ["import", "diagnose", "report"])
def test_hostile_pickles_are_refused_in_one_line_and_never_run(
    tmp_path: Path, command: str
) -> None:
    problems = []
    for name, data in _hostile_pickles(tmp_path).items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "snapshot.pickle").write_bytes(data)
        args = [command, str(folder / "snapshot.pickle")]
        if command != "diagnose":
            args += ["-o", str(folder / ("out.memdoc" if command == "import" else "out.html"))]

        said = memdoc(*args)

        if said.status == 0 or not said.one_clear_error():
            problems.append(f"{name}: exit {said.status}, said {said.stderr!r}")
        elif data.startswith(b"\x80") and "refused" not in said.stderr:
            # Protocol 2+ is read as a snapshot: the vetting, not the format check, says no.
            problems.append(f"{name}: not refused as code: {said.stderr!r}")
        if (tmp_path / MARKER).exists():
            problems.append(f"{name}: the payload ran")
            (tmp_path / MARKER).unlink()
        if sorted(os.listdir(folder)) != ["snapshot.pickle"]:
            problems.append(f"{name}: left {sorted(os.listdir(folder))}")
    assert problems == []


@pytest.mark.parametrize("command", ["import", "diagnose", "report"])
def test_broken_pickles_are_refused_in_one_line_without_output(
    tmp_path: Path, command: str
) -> None:
    problems = []
    for name, data in _broken_pickles().items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "snapshot.pickle").write_bytes(data)
        args = [command, str(folder / "snapshot.pickle")]
        if command != "diagnose":
            args += ["-o", str(folder / "out")]

        said = memdoc(*args)

        if said.status == 0 or not said.one_clear_error():
            problems.append(f"{name}: exit {said.status}, said {said.stderr!r}")
        if sorted(os.listdir(folder)) != ["snapshot.pickle"]:
            problems.append(f"{name}: left {sorted(os.listdir(folder))}")
    assert problems == []


def test_the_real_cli_refuses_a_hostile_snapshot_without_running_it(tmp_path: Path) -> None:
    (tmp_path / "snapshot.pickle").write_bytes(
        pickle.dumps(_RunsShell(_command(tmp_path)), protocol=4)
    )

    done = run_memdoc("import", "snapshot.pickle", "-o", "out.memdoc", cwd=tmp_path)

    assert done.returncode == 2
    assert done.stderr.decode().startswith("memdoc: error: ")
    assert b"Traceback" not in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["snapshot.pickle"]


MILLIONS = 10_000_000
HEADROOM_BYTES = 400 * 2**20
_LOAD_UNDER_A_LIMIT = """
import resource, sys
import psutil
from memdoc.importers.safe_pickle import RefusedPickle, load_plain_pickle

# Address space for the load: what the process has now, and HEADROOM more.
vms = psutil.Process().memory_info().vms
resource.setrlimit(resource.RLIMIT_AS, (vms + {headroom}, resource.RLIM_INFINITY))
def own_peak_kib():  # VmHWM, not ru_maxrss: that survives exec and tells the parent's size
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
before_kib = own_peak_kib()
try:
    load_plain_pickle(sys.argv[1])
    print("loaded")
except RefusedPickle as exc:
    print("refused:", exc.message)
print("grew_kib", own_peak_kib() - before_kib)
"""


@pytest.mark.parametrize(
    "empty_container",
    [pytest.param(b"}", id="empty-dicts"), pytest.param(b"]", id="empty-lists")],
)
def test_a_small_pickle_of_millions_of_objects_is_refused_before_it_is_built(
    tmp_path: Path, empty_container: bytes
) -> None:
    # GIVEN 10 MB of opcodes that build ten million containers (about 0.7 GiB in memory)
    bomb = tmp_path / "objects.pickle"
    bomb.write_bytes(b"\x80\x04](" + empty_container * MILLIONS + b"e.")
    program = tmp_path / "load.py"
    program.write_text(_LOAD_UNDER_A_LIMIT.format(headroom=HEADROOM_BYTES))

    # WHEN a process with 400 MiB of address space to spare loads it
    done = subprocess.run(
        [sys.executable, str(program), str(bomb)], capture_output=True, text=True, timeout=300
    )

    # THEN it is refused from the opcodes alone, and memory hardly moved
    assert done.returncode == 0, done.stderr
    assert "refused: its objects would take about" in done.stdout
    grew_kib = int(done.stdout.split("grew_kib")[1])
    assert grew_kib < 64 * 1024
