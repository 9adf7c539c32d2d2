"""The NVML collector: its logic above the call gate, with values recorded on real GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from memdoc.collectors.base import CollectorFailed
from memdoc.collectors.nvml import OTHER, OURS, UNRESOLVED, NvmlCollector, classify_pids, nspid_map
from memdoc.collectors.nvml_gate import (
    NO_DRIVER_REASON,
    GpuMemory,
    GpuProcess,
    NvmlUnavailable,
    open_gate,
)
from memdoc.session import Session
from memdoc.trace import Metric, SeriesKey, load_trace
from memdoc.trace.model import SCHEMA_VERSION, Header
from memdoc.trace.writer import TraceWriter
from tests.collectors.nvml_standin import RecordedDevice, RecordedGate, gate_from_nvidia_smi_xml
from tests.conftest import FIXTURES

MiB = 1024**2
DUAL_A5000 = FIXTURES / "importers" / "nvidia-smi-xml" / "dual_a5000-v13.xml"
RECORDED_PID = 100477  # the llama-server process in the recording


class _Sink:
    def __init__(self) -> None:
        self.devices: list = []
        self.processes: list = []
        self.events: list = []
        self.statuses: list = []

    def samples(self, unix_t, values):  # noqa: ANN001
        pass

    def event(self, event):  # noqa: ANN001
        self.events.append(event)

    def device(self, device):  # noqa: ANN001
        self.devices.append(device)

    def process(self, process):  # noqa: ANN001
        self.processes.append(process)

    def collector(self, status):  # noqa: ANN001
        self.statuses.append(status)

    def step(self, source="user", **data):  # noqa: ANN001
        return 0

    def record_exception(self, exc, tb=None, *, where="uncaught", context=None):  # noqa: ANN001
        pass

    def emit(self, kind, data=None):  # noqa: ANN001
        pass


@pytest.fixture
def program():
    """A real running program whose PID plays the recorded GPU process."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _gate_with_pids(pid_for_recorded: int, extra: list[GpuProcess] = ()) -> RecordedGate:
    gate = gate_from_nvidia_smi_xml(DUAL_A5000)
    for device in gate._devices:
        device.processes = [
            replace(p, pid=pid_for_recorded) if p.pid == RECORDED_PID else p
            for p in device.processes
        ] + list(extra)
    return gate


def test_device_memory_is_sampled_as_the_driver_recorded_it(program) -> None:
    collector = NvmlCollector(program.pid, gate_factory=lambda: _gate_with_pids(program.pid))
    sink = _Sink()

    assert collector.probe().available
    collector.start(sink)
    values = collector.sample(time.time())

    assert [d.name for d in sink.devices] == ["NVIDIA RTX A5000", "NVIDIA RTX A5000"]
    assert values[SeriesKey(Metric.GPU_USED, device=0)] == 22437 * MiB
    assert values[SeriesKey(Metric.GPU_FREE, device=0)] == 1678 * MiB
    assert values[SeriesKey(Metric.GPU_TOTAL, device=1)] == 24564 * MiB
    assert values[SeriesKey(Metric.GPU_USED, device=1)] == 17253 * MiB


def test_per_process_memory_marks_the_runs_processes_as_ours_and_others_as_other(program) -> None:
    other_pid = os.getpid()  # exists, but is not in the program's tree
    gone_pid = 2**22 + 12345  # does not exist here: as seen from inside a container
    gate = _gate_with_pids(
        program.pid, [GpuProcess(other_pid, 512 * MiB), GpuProcess(gone_pid, 1024 * MiB)]
    )
    collector = NvmlCollector(program.pid, gate_factory=lambda: gate)
    sink = _Sink()
    collector.probe()
    collector.start(sink)

    values = collector.sample(time.time())

    assert values[SeriesKey(Metric.GPU_PROC_USED, device=0, pid=program.pid)] == 22430 * MiB
    assert values[SeriesKey(Metric.GPU_PROC_USED, device=1, pid=program.pid)] == 17246 * MiB
    announced = {p.pid: p for p in sink.processes}
    assert program.pid not in announced  # the host collector announces our own
    assert announced[other_pid].ours is False and announced[other_pid].command
    assert announced[gone_pid].ours is False
    assert "another PID namespace" in announced[gone_pid].command[0]


def test_process_lists_are_read_rarely_and_device_memory_every_tick(program) -> None:
    gate = _gate_with_pids(program.pid)
    collector = NvmlCollector(program.pid, gate_factory=lambda: gate, process_interval_s=3.0)
    collector.probe()
    collector.start(_Sink())
    t0 = time.time()

    for i in range(20):
        values = collector.sample(t0 + i * 0.1)

    assert gate.process_reads == 2  # once per device, at the first tick only
    assert gate.memory_reads == 40
    assert SeriesKey(Metric.GPU_PROC_USED, device=0, pid=program.pid) in values


def test_mig_instances_are_devices_of_their_own_with_their_parent() -> None:
    physical = DeviceInfo_(0, "NVIDIA H200", 143771)
    migs = [
        DeviceInfo_(1 + i, f"NVIDIA H200 MIG {p}", size, parent=0)
        for i, (p, size) in enumerate(
            [
                ("1c.3g.71gb", 71424),
                ("2c.3g.71gb", 71424),
                ("2g.35gb", 33280),
                ("1g.18gb", 16384),
                ("1g.18gb", 16384),
            ]
        )
    ]
    used = [55, 22, 22, 17, 9, 9]
    gate = RecordedGate(
        [
            RecordedDevice(d, GpuMemory(d.total_bytes, u * MiB, d.total_bytes - u * MiB))
            for d, u in zip([physical, *migs], used)
        ]
    )
    collector = NvmlCollector(os.getpid(), gate_factory=lambda: gate)
    sink = _Sink()
    collector.probe()
    collector.start(sink)

    values = collector.sample(time.time())

    assert [d.parent_index for d in sink.devices] == [None, 0, 0, 0, 0, 0]
    assert values[SeriesKey(Metric.GPU_TOTAL, device=3)] == 33280 * MiB
    assert values[SeriesKey(Metric.GPU_USED, device=4)] == 9 * MiB


def DeviceInfo_(index: int, name: str, total_mib: int, parent: int | None = None):  # noqa: N802
    from memdoc.trace.model import DeviceInfo

    return DeviceInfo(index=index, name=name, total_bytes=total_mib * MiB, parent_index=parent)


def test_a_gpu_that_stops_answering_drops_the_collector_with_a_note_and_the_session_goes_on(
    tmp_path: Path, program
) -> None:
    gate = _gate_with_pids(program.pid)
    gate.break_after_reads = 6
    from memdoc.collectors.host import HostCollector

    path = tmp_path / "t.memdoc"
    writer = TraceWriter(
        path, Header(version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="t")
    )
    session = Session(
        writer,
        [HostCollector(program.pid), NvmlCollector(program.pid, gate_factory=lambda: gate)],
        interval_s=0.02,
    ).start()
    time.sleep(0.5)
    session.stop()
    writer.close()

    trace = load_trace(path)
    dropped = [s for s in trace.unavailable_collectors() if s.name == "nvml"]
    assert dropped and "NVML stopped answering" in (dropped[0].reason or "")
    host = trace.series(Metric.HOST_RSS)
    used = trace.series(Metric.GPU_USED, device=0)
    assert host is not None and used is not None
    assert host.times[-1] > used.times[-1]  # host sampling went on after NVML broke
    assert gate.closed


def _record(tmp_path: Path, gate: RecordedGate, root_pid: int) -> Path:
    path = tmp_path / "t.memdoc"
    writer = TraceWriter(
        path, Header(version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="t")
    )
    collector = NvmlCollector(root_pid, gate_factory=lambda: gate, process_interval_s=0.05)
    session = Session(writer, [collector], interval_s=0.02).start()
    # At least 0.5 s and at least 12 ticks (two GPUs read each) with 4 process lists each: on
    # a loaded machine (the suite runs in parallel) 0.5 s may hold fewer ticks than asserted.
    time.sleep(0.5)
    deadline = time.monotonic() + 30
    while (gate.memory_reads < 24 or gate.process_reads < 8) and time.monotonic() < deadline:
        time.sleep(0.05)
    session.stop()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("call", "error"),
    [
        pytest.param("processes", "NVMLError_NoPermission", id="process-list-no-permission"),
        pytest.param("processes", "NVMLError_NotSupported", id="process-list-not-supported"),
        pytest.param("memory", "NVMLError_NotSupported", id="device-memory-not-supported"),
    ],
)
def test_one_refused_call_on_one_gpu_makes_that_value_not_available_and_the_rest_goes_on(
    tmp_path: Path, program, call: str, error: str
) -> None:
    pynvml = pytest.importorskip("pynvml")
    # GIVEN two recorded GPUs, each with the program on it; NVML refuses one call on GPU 1
    gate = _gate_with_pids(program.pid, extra=[GpuProcess(program.pid, 5 * MiB)])
    gate.refuse[call, 1] = getattr(pynvml, error)()

    # WHEN memdoc samples them for a while
    trace = load_trace(_record(tmp_path, gate, program.pid))

    # THEN NVML stays on: GPU 0 is sampled to the end, and so is GPU 1's other value
    assert not [s for s in trace.unavailable_collectors() if s.name == "nvml"]
    used_0 = trace.series(Metric.GPU_USED, device=0)
    proc_0 = trace.series(Metric.GPU_PROC_USED, device=0, pid=program.pid)
    assert used_0 is not None and len(used_0) >= 10
    assert proc_0 is not None and len(proc_0) >= 3
    used_1 = trace.series(Metric.GPU_USED, device=1)
    proc_1 = trace.series(Metric.GPU_PROC_USED, device=1, pid=program.pid)
    refused, kept = (proc_1, used_1) if call == "processes" else (used_1, proc_1)
    # AND the refused value is missing (never 0), the other one of GPU 1 is there
    assert refused is None
    assert kept is not None and len(kept) >= 3
    # AND it was said once, with NVML's reason
    notes = [e.data["text"] for e in trace.events("note") if "NVML refused" in e.data["text"]]
    assert len(notes) == 1 and "GPU 1" in notes[0] and str(getattr(pynvml, error)()) in notes[0]


def test_on_a_machine_without_a_driver_the_real_gate_says_so_in_one_line() -> None:
    try:
        gate = open_gate()
    except NvmlUnavailable as exc:
        assert exc.reason == NO_DRIVER_REASON
        assert exc.hint
    else:  # a GPU machine
        assert gate.devices()
        gate.close()


def test_a_sample_from_a_broken_gate_raises_collector_failed() -> None:
    gate = RecordedGate([])
    gate.break_after_reads = 0
    gate._devices = [RecordedDevice(DeviceInfo_(0, "x", 10), GpuMemory(10 * MiB, MiB, 9 * MiB))]
    collector = NvmlCollector(os.getpid(), gate_factory=lambda: gate)
    collector.probe()
    collector.start(_Sink())

    with pytest.raises(CollectorFailed):
        collector.sample(time.time())


@pytest.mark.parametrize(
    ("nvml_pids", "tree", "outer", "exists", "expected"),
    [
        pytest.param([10], {10}, {}, set(), {10: (OURS, 10)}, id="same-namespace-ours"),
        pytest.param([11], {10}, {}, {11}, {11: (OTHER, 11)}, id="same-namespace-other"),
        pytest.param(
            [5010], {10}, {5010: 10}, set(), {5010: (OURS, 10)}, id="nested-namespace-ours"
        ),
        pytest.param([5011], {10}, {}, set(), {5011: (UNRESOLVED, 5011)}, id="invisible-pid"),
    ],
)
def test_nvml_pids_are_classified_across_pid_namespaces(
    nvml_pids, tree, outer, exists, expected
) -> None:
    assert classify_pids(nvml_pids, tree, outer, exists.__contains__) == expected


def test_nspid_lines_map_outer_pids_to_local_ones(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "status").write_text("Name:\tpython\nNSpid:\t5010\t10\n")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "status").write_text("Name:\tpython\nNSpid:\t11\n")

    assert nspid_map([10, 11, 12], proc_root=tmp_path) == {5010: 10}


def test_a_lost_gpu_is_not_a_refused_value_but_the_end_of_nvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    gate = RecordedGate([])
    gate._devices = [RecordedDevice(DeviceInfo_(0, "x", 10), GpuMemory(10 * MiB, MiB, 9 * MiB))]
    gate.refuse["memory", 0] = pynvml.NVMLError_GpuIsLost()
    collector = NvmlCollector(os.getpid(), gate_factory=lambda: gate)
    collector.probe()
    collector.start(_Sink())

    with pytest.raises(CollectorFailed, match="NVML stopped answering"):
        collector.sample(time.time())


def test_without_a_sign_of_a_driver_nvml_is_not_loaded_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No /proc/driver/nvidia, /dev/nvidiactl or /dev/dxg: the driver is not there, and
    # loading nvidia-ml-py only to hear so cost every `memdoc run` some 45 ms.
    import sys

    from memdoc.collectors import nvml_gate

    monkeypatch.setattr(nvml_gate, "present", lambda signs: False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing it now would fail loudly

    with pytest.raises(nvml_gate.NvmlUnavailable) as raised:
        nvml_gate.open_gate()

    assert raised.value.reason == nvml_gate.NO_DRIVER_REASON
