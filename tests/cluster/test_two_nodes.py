"""A job on two "nodes" (two `memdoc run -- torchrun` launchers on this machine, gloo on CPU)
writes one trace per node into one folder, and every reader takes the folder as one run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from memdoc.trace import load_trace
from tests.conftest import memdoc_cmd, run_memdoc

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.xdist_group("two-nodes")]
pytest.importorskip("torch.distributed")

PROGRAM = Path(__file__).resolve().parent / "ddp_host_oom.py"
FAIL_RANK = 3  # node 1, local rank 1


@dataclass(frozen=True)
class TwoNodeRun:
    folder: Path
    launchers: tuple[subprocess.CompletedProcess[bytes], ...]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launcher(folder: Path, node: int, port: int) -> subprocess.Popen[bytes]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    command = memdoc_cmd(
        "run",
        "-o",
        f"{folder}/",
        "--",
        torchrun,
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(PROGRAM),
    )
    env = {**os.environ, "FAIL_RANK": str(FAIL_RANK), "OMP_NUM_THREADS": "1"}
    env.pop("MEMDOC_AGENT", None)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodeRun]:
    folder = tmp_path_factory.mktemp("job") / "traces"  # created by the launchers
    port = _free_port()
    procs = [_launcher(folder, node, port) for node in (0, 1)]
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    yield TwoNodeRun(folder, tuple(done))


def test_each_node_writes_its_own_trace_named_by_host_node_and_pid(two_nodes: TwoNodeRun) -> None:
    names = sorted(p.name for p in two_nodes.folder.iterdir())
    host = socket.gethostname()

    assert len(names) == 2, names
    for node, name in enumerate(names):
        assert name.startswith(f"memdoc-{host}-node{node}-") and name.endswith(".memdoc")
        assert load_trace(two_nodes.folder / name).header.node_rank == node
    # Both launchers fail, as the program's own torchrun would.
    assert all(done.returncode != 0 for done in two_nodes.launchers)


def test_diagnose_of_the_folder_names_the_failing_rank_and_node_first(
    two_nodes: TwoNodeRun,
) -> None:
    done = run_memdoc("diagnose", "--json", str(two_nodes.folder))

    assert done.returncode == 3, done.stderr.decode()  # 3: a memory problem found
    out = json.loads(done.stdout)
    first = out["findings"][0]
    assert first["rule"] == "rank-failed-first"
    assert first["summary"].startswith(f"Rank {FAIL_RANK} (node 1, host {socket.gethostname()}")
    assert {"text": "node rank of the first failure: 1", "value": 1.0, "unit": "count"} in first[
        "evidence"
    ]
    # The run's OOM is the failing rank's own: a host allocation beyond its address-space cap.
    assert out["oom"]["framework"] == "host"


def test_diagnose_in_the_terminal_reads_the_folder(two_nodes: TwoNodeRun) -> None:
    done = run_memdoc("diagnose", str(two_nodes.folder))

    assert done.returncode == 3, done.stderr.decode()  # 3: a memory problem found
    text = done.stdout.decode()
    assert "Rank 3 (node 1" in text
    assert "1. One rank failed first" in text
    ranks = text[text.index("\nRanks") :]
    node1 = next(line for line in ranks.splitlines() if line.lstrip().startswith("node 1"))
    assert "failed first" in node1
    assert any(line.lstrip().startswith("node 0") for line in ranks.splitlines())


def test_report_of_the_folder_is_written_inside_it(two_nodes: TwoNodeRun) -> None:
    done = run_memdoc("report", str(two_nodes.folder), "--force")

    assert done.returncode == 0, done.stderr.decode()
    report = two_nodes.folder / "report.html"
    assert report.is_file()
    assert "Rank 3 (node 1" in report.read_text()
    # The report beside the traces is not read back as a trace next time.
    assert run_memdoc("diagnose", "--json", str(two_nodes.folder)).returncode == 3


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_opens_the_folder_on_the_node_that_failed_first(
    two_nodes: TwoNodeRun, tmp_path: Path
) -> None:
    from tests.tui.conftest import Terminal

    term = Terminal(tmp_path / "status", (100, 32))
    try:
        term.start(" ".join([sys.executable, "-m", "memdoc", "live", str(two_nodes.folder)]))
        failed = next(p.name for p in two_nodes.folder.iterdir() if "-node1-" in p.name)
        term.wait_for(failed[:30])
        term.press("q")
        assert term.exit_status() == 0
    finally:
        term.close()


def test_an_empty_folder_is_one_clear_error(tmp_path: Path) -> None:
    done = run_memdoc("diagnose", str(tmp_path))

    assert done.returncode == 2
    assert done.stderr.decode().splitlines()[0] == (
        f"memdoc: error: {tmp_path}: a folder with no memdoc trace in it"
    )
