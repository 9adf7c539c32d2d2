"""A collector that breaks mid-run drops out with a note; the session and the trace go on."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memdoc.collectors.base import Collector, CollectorFailed, SessionHandle, Values
from memdoc.collectors.frameworks import LazyFrameworkCollector
from memdoc.collectors.host import HostCollector
from memdoc.collectors.nvml import NvmlCollector
from memdoc.session import Session
from memdoc.trace import (
    SCHEMA_VERSION,
    CollectorStatus,
    ExitInfo,
    Header,
    Metric,
    SeriesKey,
    Trace,
    TraceWriter,
    load_trace,
)
from tests.collectors.nvml_standin import gate_from_nvidia_smi_xml
from tests.conftest import FIXTURES

INTERVAL_S = 0.01
DUAL_A5000 = FIXTURES / "importers" / "nvidia-smi-xml" / "dual_a5000-v13.xml"


class BreaksAfter:
    """A framework collector stand-in: counts up for `good_samples` ticks, then fails the way
    `failure` says (an exception from the framework, or memdoc's own CollectorFailed)."""

    def __init__(self, name: str, good_samples: int, failure: Callable[[], Exception]) -> None:
        self.name = name
        self.good_samples = good_samples
        self.failure = failure
        self.samples = 0
        self.closed = False

    def probe(self) -> CollectorStatus:
        return CollectorStatus(self.name, True, version="stand-in")

    def start(self, session: SessionHandle) -> None:
        pass

    def sample(self, unix_t: float) -> Values:
        self.samples += 1
        if self.samples > self.good_samples:
            raise self.failure()
        return {SeriesKey("torch.allocated", 0, os.getpid()): 1000 * self.samples}

    def close(self) -> None:
        self.closed = True

    def oom_context(self, exc: BaseException) -> None:
        return None

    def on_mark(self, label: str, data: object) -> None:
        pass


def _record(
    path: Path, collectors: list[Collector], seconds: float = 0.6
) -> tuple[Trace, list[str]]:
    """Run a real session on its thread into a real trace; the trace read back, and the
    collectors still running just before the session stopped."""
    header = Header(version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="test")
    writer = TraceWriter(path, header)
    session = Session(
        writer,
        [HostCollector(os.getpid(), include_children=False), *collectors],
        interval_s=INTERVAL_S,
    )
    session.start()
    time.sleep(seconds)
    running = session.active_collectors()
    session.stop()
    writer.close(ExitInfo(time.time(), exit_code=0))
    return load_trace(path), running


def _dropped(trace: Trace, name: str) -> CollectorStatus:
    notes = [c for c in trace.collectors() if c.name == name and not c.available]
    assert len(notes) == 1, trace.collectors()
    return notes[0]


def _host_samples_after(trace: Trace, t: float) -> int:
    rss = trace.series(Metric.HOST_RSS, pid=os.getpid())
    assert rss is not None
    return sum(1 for time_s in rss.times if time_s > t)


@pytest.mark.parametrize(
    ("failure", "reason", "hint"),
    [
        pytest.param(
            lambda: RuntimeError("CUDA error: an illegal memory access"),
            "illegal memory access",
            None,
            id="framework-raises",
        ),
        pytest.param(
            lambda: CollectorFailed("allocator stats vanished", "upgrade torch"),
            "allocator stats vanished",
            "upgrade torch",
            id="collector-gives-up",
        ),
    ],
)
def test_a_framework_collector_that_breaks_mid_run_drops_out_with_a_note_and_sampling_goes_on(
    tmp_path: Path, failure: Callable[[], Exception], reason: str, hint: str | None
) -> None:
    broken = BreaksAfter("pytorch", good_samples=10, failure=failure)
    lazy = LazyFrameworkCollector("pytorch", "json", lambda: broken)  # json: already imported

    trace, running = _record(tmp_path / "t.memdoc", [lazy])

    note = _dropped(trace, "pytorch")
    assert reason in (note.reason or "") and note.hint == hint
    assert note.pid == os.getpid()
    framework = trace.series("torch.allocated", 0, os.getpid())
    assert framework is not None and list(framework.values) == [1000.0 * i for i in range(1, 11)]
    assert _host_samples_after(trace, note.t) >= 5
    assert broken.closed and running == ["host"]


def test_nvml_that_stops_answering_mid_run_drops_out_with_the_reason_and_a_hint(
    tmp_path: Path,
) -> None:
    gate = gate_from_nvidia_smi_xml(DUAL_A5000)
    gate.break_after_reads = 2 * 15  # two devices, fifteen good ticks
    nvml = NvmlCollector(os.getpid(), gate_factory=lambda: gate)

    trace, running = _record(tmp_path / "t.memdoc", [nvml])

    note = _dropped(trace, "nvml")
    assert "NVML stopped answering" in (note.reason or "") and "GpuIsLost" in (note.reason or "")
    assert note.hint
    for device in (0, 1):
        used = trace.series(Metric.GPU_USED, device)
        assert used is not None and 14 <= len(used) <= 15
        assert used.times[-1] <= note.t
    assert len(trace.devices()) == 2
    assert _host_samples_after(trace, note.t) >= 5
    assert gate.closed and running == ["host"]


class _FailsToStart(BreaksAfter):
    def start(self, session: SessionHandle) -> None:
        raise OSError("libcudart.so: cannot open shared object file")


class _FailsToProbe(BreaksAfter):
    def probe(self) -> CollectorStatus:
        raise ImportError("torch._C is broken")


@pytest.mark.parametrize(
    ("collector", "reason"),
    [
        pytest.param(_FailsToStart("pytorch", 10, RuntimeError), "libcudart", id="start-raises"),
        pytest.param(
            _FailsToProbe("pytorch", 10, RuntimeError), "torch._C is broken", id="probe-raises"
        ),
    ],
)
def test_a_collector_that_cannot_start_is_noted_and_the_others_run(
    tmp_path: Path, collector: BreaksAfter, reason: str
) -> None:
    trace, running = _record(tmp_path / "t.memdoc", [collector], seconds=0.3)

    assert reason in (_dropped(trace, "pytorch").reason or "")
    assert _host_samples_after(trace, 0.0) >= 5
    assert running == ["host"]


class _SaysNonsense(BreaksAfter):
    def sample(self, unix_t: float) -> Values:
        return {SeriesKey("torch.allocated", 0, os.getpid()): "12 GiB"}  # type: ignore[dict-item]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_collector_value_that_is_not_a_number_is_not_recorded_and_sampling_goes_on(
    tmp_path: Path,
) -> None:
    trace, _ = _record(tmp_path / "t.memdoc", [_SaysNonsense("pytorch", 10, RuntimeError)])

    assert trace.series("torch.allocated", 0, os.getpid()) is None
    assert _host_samples_after(trace, 0.3) >= 5
