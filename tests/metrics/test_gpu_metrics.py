"""Device and per-process GPU metrics, from driver and allocator values recorded on real GPUs
(NVML and the CUDA counters through their stand-ins at the gate), scraped over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from memdoc.collectors.host import HostCollector
from memdoc.collectors.nvml import NvmlCollector
from memdoc.collectors.nvml_gate import GpuProcess
from memdoc.metrics.families import MemdocCollector
from memdoc.metrics.identity import JobIdentity
from memdoc.metrics.server import serve
from memdoc.metrics.sources import TraceFileSource
from memdoc.session import Session
from memdoc.trace import load_trace
from memdoc.trace.ledger import ledger_at
from memdoc.trace.model import SCHEMA_VERSION, ExitInfo, Header, ProcessInfo
from memdoc.trace.writer import TraceWriter
from tests.collectors.nvml_standin import RecordedGate, gate_from_nvidia_smi_xml
from tests.collectors.torch_cuda_standin import RecordedCudaGate, recorded_stats
from tests.conftest import FIXTURES
from tests.metrics.scrape import Sample, only, scrape

MiB = 1024**2
DUAL_A5000 = FIXTURES / "importers" / "nvidia-smi-xml" / "dual_a5000-v13.xml"
RECORDED_PID = 100477  # the process on both GPUs in the recording
RUN_STATE = recorded_stats("flexgen_opt_1.3b")["memory_stats"]
IDENTITY = JobIdentity(host="node-a", job="77", node_rank=1)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.fixture
def processes() -> Iterator[tuple[int, int]]:
    """Two real processes: one plays the run's rank, the other a stranger on the GPU."""
    ours, stranger = _sleeper(), _sleeper()
    yield ours.pid, stranger.pid
    for proc in (ours, stranger):
        proc.kill()
        proc.wait()


def _gate(ours: int, stranger: int) -> RecordedGate:
    gate = gate_from_nvidia_smi_xml(DUAL_A5000)
    for device in gate._devices:
        device.processes = [
            replace(p, pid=ours) if p.pid == RECORDED_PID else p for p in device.processes
        ]
    gate._devices[0].processes.append(GpuProcess(stranger, 512 * MiB))
    return gate


def _record(path: Path, ours: int, stranger: int) -> None:
    """A run's trace as the parent writes it: host and NVML sampled, a rank's PyTorch
    counters (recorded on a GPU) as its agent sends them."""
    from memdoc.collectors.pytorch import TorchCollector

    header = Header(
        version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="t", pid=os.getpid()
    )
    writer = TraceWriter(path, header)
    writer.process(ProcessInfo(pid=ours, t=time.time(), rank=4, local_rank=0))
    session = Session(
        writer,
        [HostCollector(ours), NvmlCollector(ours, gate_factory=lambda: _gate(ours, stranger))],
        interval_s=0.05,
    ).start()
    torch = TorchCollector(gate=RecordedCudaGate({0: RUN_STATE}), files=None, environ={})
    torch._pid = ours
    try:
        time.sleep(0.3)
        writer.samples(time.time(), torch.sample(time.time()))
        time.sleep(0.3)
    finally:
        torch.close()
        session.stop()
        writer.close(ExitInfo(t=time.time(), exit_code=0))


def _scrape_trace(path: Path) -> list[Sample]:
    server = serve(MemdocCollector(TraceFileSource(path), IDENTITY), 0)
    try:
        return scrape(server.url)
    finally:
        server.stop()


@pytest.fixture
def recorded(tmp_path: Path, processes: tuple[int, int]) -> tuple[Path, list[Sample]]:
    path = tmp_path / "run.memdoc"
    _record(path, *processes)
    return path, _scrape_trace(path)


def test_device_ledger_terms_are_the_ledger_of_the_trace_and_add_up_to_the_total(
    recorded: tuple[Path, list[Sample]],
) -> None:
    path, samples = recorded
    trace = load_trace(path)
    for device in (0, 1):
        ledger = ledger_at(trace, device, trace.last_t)
        terms = [
            s
            for s in samples
            if s.name == "memdoc_device_memory_bytes" and s.labels["device"] == str(device)
        ]
        got = {(s.labels["term"], s.labels["framework"]): s.value for s in terms}
        assert got == {(t.key, t.framework or ""): float(t.bytes) for t in ledger.terms}
        total = only(samples, "memdoc_device_total_bytes", device=str(device)).value
        assert total == 24564 * MiB
        assert sum(got.values()) == total
    allocated = only(samples, "memdoc_device_memory_bytes", device="0", term="allocated")
    assert allocated.value == RUN_STATE["allocated_bytes.all.current"]
    assert allocated.labels["framework"] == "pytorch"
    assert only(
        samples, "memdoc_device_memory_bytes", device="0", term="other_processes"
    ).value == (512 * MiB)


def test_per_process_gpu_memory_names_the_rank_and_tells_ours_from_a_stranger(
    recorded: tuple[Path, list[Sample]], processes: tuple[int, int]
) -> None:
    _, samples = recorded
    ours, stranger = processes

    mine = only(samples, "memdoc_process_gpu_used_bytes", device="0", pid=str(ours))
    assert mine.value == 22430 * MiB  # the driver's figure, as recorded
    assert mine.labels["ours"] == "true" and mine.labels["rank"] == "4"
    assert mine.labels["local_rank"] == "0" and mine.labels["node_rank"] == "1"
    other = only(samples, "memdoc_process_gpu_used_bytes", device="0", pid=str(stranger))
    assert other.value == 512 * MiB and other.labels["ours"] == "false"
    assert only(samples, "memdoc_process_gpu_used_bytes", device="1", pid=str(ours)).value == (
        17246 * MiB
    )


def test_a_process_ledger_splits_its_driver_figure_into_pool_and_the_rest(
    recorded: tuple[Path, list[Sample]], processes: tuple[int, int]
) -> None:
    _, samples = recorded
    ours, _ = processes
    allocated = RUN_STATE["allocated_bytes.all.current"]
    reserved = RUN_STATE["reserved_bytes.all.current"]

    def term(key: str) -> float:
        return only(
            samples, "memdoc_process_memory_bytes", device="0", pid=str(ours), term=key
        ).value

    assert term("allocated") == allocated
    assert term("cached_free") == reserved - allocated
    assert term("process_other") == 22430 * MiB - reserved  # context and other allocators


def test_a_finished_run_reads_as_not_running_with_its_labels(
    recorded: tuple[Path, list[Sample]],
) -> None:
    _, samples = recorded
    running = only(samples, "memdoc_running")
    assert running.value == 0.0
    assert running.labels == {
        "host": "node-a",
        "job": "77",
        "node_rank": "1",
        "rank": "",
        "local_rank": "",
    }
