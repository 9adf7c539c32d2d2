"""`memdoc top` shows the programs that run under memdoc, with what their traces say they hold."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from memdoc.collectors.nvml_gate import GpuProcess
from memdoc.recordings import live_recordings, register, unregister
from memdoc.trace import (
    SCHEMA_VERSION,
    DeviceInfo,
    Header,
    Metric,
    ProcessInfo,
    SeriesKey,
    Trace,
    TraceWriter,
)
from memdoc.tui.feed import Feed
from memdoc.tui.system import SystemSource
from memdoc.tui.under_memdoc import RecordingRow, framework_device
from memdoc.tui.view import ProcessRow, ViewRequest
from memdoc.tui.widgets.processes import (
    BASE_COLUMNS,
    FW_ALLOC,
    FW_RESERVED,
    HOST_RSS,
    MIN_COMMAND_CELLS,
    USER,
    columns_for,
    header_line,
    row_line,
)
from memdoc.tui.widgets.recordings import recording_lines
from memdoc.units import GiB
from tests.collectors.nvml_standin import RecordedDevice, RecordedGate, gate_from_nvidia_smi_xml
from tests.tui.conftest import ManualClock, no_rules

XML = (
    Path(__file__).resolve().parent.parent / "fixtures/importers/nvidia-smi-xml/dual_a5000-v13.xml"
)
MiB = 1024**2


def _gate_with_pid_on_gpu_1(pid: int) -> RecordedGate:
    """The two recorded RTX A5000, with the process on GPU 1 given `pid`."""
    recorded = gate_from_nvidia_smi_xml(XML)
    devices = []
    for info in recorded.devices():
        processes = recorded.processes(info.index)
        if info.index == 1:
            processes = [GpuProcess(pid, p.used_bytes) for p in processes]
        devices.append(RecordedDevice(info, recorded.memory(info.index), processes))
    return RecordedGate(devices)


def _recorded_run(path: Path, pid: int, *, visible: str | None) -> None:
    """A trace as `memdoc.watch` writes it while it runs: PyTorch on its device 0."""
    env = {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {}
    now = time.time()
    header = Header(SCHEMA_VERSION, now, "test", ("train.py",), pid=pid, env=env, mode="watch")
    writer = TraceWriter(path, header)
    writer.process(ProcessInfo(pid=pid, t=now, command=("python", "train.py")))
    writer.samples(
        now,
        {
            SeriesKey("torch.allocated", 0, pid): 12 * GiB,
            SeriesKey("torch.reserved", 0, pid): 14 * GiB,
            SeriesKey(Metric.HOST_RSS): 3 * GiB,
        },
    )
    writer.close()  # flushed, and no end record: still running as far as readers can tell


def test_a_process_under_memdoc_shows_its_framework_memory_on_the_gpu_it_uses(
    tmp_path: Path,
) -> None:
    # GIVEN a run that sees only GPU 1 (as its device 0), announced in the registry,
    # and NVML showing that process on GPU 1
    pid = os.getpid()
    _recorded_run(tmp_path / "run.memdoc", pid, visible="1")
    entry = register(tmp_path / "run.memdoc", ["train.py"], directory=tmp_path / "registry")
    gate = _gate_with_pid_on_gpu_1(pid)
    source = SystemSource(
        0.1,
        gate_factory=lambda: gate,
        find_recordings=lambda: live_recordings(tmp_path / "registry"),
    )
    feed = Feed(source, rules=no_rules)
    # WHEN memdoc top shows each GPU
    on_gpu_1 = feed.next_frame(ViewRequest(device=1)).view
    on_gpu_0 = feed.next_frame(ViewRequest(device=0)).view
    source.close()
    unregister(entry)
    # THEN the process on GPU 1 carries its trace's allocated and reserved bytes
    [row] = on_gpu_1.processes
    assert (row.pid, row.gpu_bytes, row.under_memdoc) == (pid, 17246 * MiB, True)
    assert (row.framework_allocated_bytes, row.framework_reserved_bytes) == (12 * GiB, 14 * GiB)
    assert row.rss_bytes is not None  # a live process: its host memory is read too
    # and the process on GPU 0 is just a process
    assert [(r.pid, r.under_memdoc) for r in on_gpu_0.processes] == [(100477, False)]
    # and the run is listed, with its trace
    assert on_gpu_1.recordings == (
        RecordingRow(pid, "train.py", 3 * GiB, tmp_path / "run.memdoc", pytest.approx(0, abs=5)),
    )


def test_a_process_under_memdoc_the_driver_does_not_show_is_listed_from_its_trace(
    tmp_path: Path,
) -> None:
    # In a container NVML often lists no process at all: the trace still knows.
    pid = os.getpid()
    _recorded_run(tmp_path / "run.memdoc", pid, visible=None)
    entry = register(tmp_path / "run.memdoc", ["train.py"], directory=tmp_path / "registry")
    gate = _gate_with_pid_on_gpu_1(1)
    source = SystemSource(
        0.1,
        gate_factory=lambda: gate,
        find_recordings=lambda: live_recordings(tmp_path / "registry"),
    )
    view = Feed(source, rules=no_rules).next_frame(ViewRequest(device=0)).view
    source.close()
    unregister(entry)
    assert [(r.pid, r.gpu_bytes, r.framework_allocated_bytes) for r in view.processes] == [
        (pid, None, 12 * GiB),
        (100477, 22430 * MiB, None),
    ]


def test_the_registry_is_read_every_few_seconds_not_every_sample(tmp_path: Path) -> None:
    clock = ManualClock()
    folder = tmp_path / "registry"
    _recorded_run(tmp_path / "run.memdoc", os.getpid(), visible=None)
    source = SystemSource(
        1.0,
        gate_factory=lambda: gate_from_nvidia_smi_xml(XML),
        clock=clock,
        find_recordings=lambda: live_recordings(folder),
    )
    assert source.poll().recordings == ()
    entry = register(tmp_path / "run.memdoc", ["train.py"], directory=folder)
    clock.advance(1.0)
    assert source.poll().recordings == ()
    clock.advance(1.0)
    [live] = source.poll().recordings or ()
    assert live.recording.trace_path == tmp_path / "run.memdoc"
    assert isinstance(live.trace, Trace) and live.trace.our_pids() == {os.getpid()}
    unregister(entry)
    clock.advance(2.0)
    assert source.poll().recordings == ()
    source.close()


def test_a_registered_file_that_is_not_a_trace_is_listed_but_not_read(tmp_path: Path) -> None:
    (tmp_path / "notes.memdoc").write_text("not a trace\n")
    entry = register(tmp_path / "notes.memdoc", ["x.py"], directory=tmp_path / "registry")
    source = SystemSource(
        0.1,
        gate_factory=lambda: gate_from_nvidia_smi_xml(XML),
        find_recordings=lambda: live_recordings(tmp_path / "registry"),
    )
    state = source.poll()
    source.close()
    unregister(entry)
    assert [(r.recording.trace_path.name, r.trace) for r in state.recordings or ()] == [
        ("notes.memdoc", None)
    ]


DEVICES = [
    DeviceInfo(0, "A", uuid="GPU-aaaa1111-0000"),
    DeviceInfo(1, "B", uuid="GPU-bbbb2222-0000"),
    DeviceInfo(2, "C", uuid="GPU-cccc3333-0000"),
]


@pytest.mark.parametrize(
    ("visible", "nvml_index", "expected"),
    [
        pytest.param(None, 2, 2, id="all-visible"),
        pytest.param("2,0", 2, 0, id="by-index"),
        pytest.param("2,0", 0, 1, id="by-index-second"),
        pytest.param("2,0", 1, None, id="hidden"),
        pytest.param("GPU-bbbb2222", 1, 0, id="by-uuid-prefix"),
        pytest.param("0,junk,1", 1, None, id="cuda-stops-at-junk"),
        pytest.param("", 0, None, id="none-visible"),
    ],
)
def test_framework_device_indexes_follow_the_runs_cuda_visible_devices(
    visible: str | None, nvml_index: int, expected: int | None
) -> None:
    env = {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {}
    trace = Trace(Header(SCHEMA_VERSION, 0.0, "test", env=env))
    assert framework_device(trace, nvml_index, DEVICES) == expected


PLAIN = ProcessRow(100250, "ana", "python serve.py", 6 * GiB, 2 * GiB, ours=False)
RECORDED = ProcessRow(
    4194301,
    "ana",
    "python train.py --lr 3e-4",
    17 * GiB,
    3 * GiB,
    ours=False,
    recorder_pid=4194300,
    framework_allocated_bytes=12 * GiB,
    framework_reserved_bytes=14 * GiB,
)


def test_the_framework_columns_appear_only_with_a_process_under_memdoc() -> None:
    assert tuple(columns_for([PLAIN], 120)) == BASE_COLUMNS
    assert {FW_ALLOC, FW_RESERVED} <= set(columns_for([PLAIN, RECORDED], 120))


@pytest.mark.parametrize(
    ("width", "gone"),
    [
        pytest.param(120, set(), id="wide"),
        pytest.param(70, {USER}, id="seventy"),
        pytest.param(58, {USER, HOST_RSS}, id="sixty"),
    ],
)
def test_in_a_narrow_table_user_then_rss_give_way_to_the_command(
    width: int, gone: set[str]
) -> None:
    columns = columns_for([PLAIN, RECORDED], width)
    assert set(BASE_COLUMNS) - set(columns) == gone
    assert width - sum(columns.values()) - 1 >= MIN_COMMAND_CELLS
    header = header_line(columns, width).plain
    recorded = row_line(RECORDED, columns, width).plain
    plain = row_line(PLAIN, columns, width).plain
    fw_start = header.index(FW_ALLOC)
    fw_end = header.index(FW_RESERVED) + len(FW_RESERVED)
    assert recorded.startswith("● 4194301 ")
    assert recorded[fw_start:fw_end].split() == ["12.0", "GiB", "14.0", "GiB"]
    assert plain[fw_start:fw_end].strip() == ""  # no trace to ask: blank, not unknown
    assert "python train" in recorded
    assert all(len(line) <= width for line in (header, recorded, plain))


def test_the_running_list_fits_sixty_columns_and_keeps_the_end_of_the_trace_path() -> None:
    row = RecordingRow(
        4194301,
        "python train.py --model llama-7b --batch-size 64 --lr 3e-4",
        3 * GiB,
        Path("/home/ana/experiments/2025-sweep/run-0042/attempt-3/train.memdoc"),
        125.0,
    )
    lines = [line.plain for line in recording_lines((row,), 58)]
    assert lines[0] == "Under memdoc  1 running"
    assert lines[1].startswith("● 4194301  python train.py") and lines[1].endswith("…")
    assert lines[2].startswith("  RSS 3.0 GiB · running 2m05s · …")
    assert lines[2].endswith("attempt-3/train.memdoc")
    assert all(len(line) <= 58 for line in lines)
    assert [line.plain for line in recording_lines((), 58)] == ["Under memdoc  none running"]
