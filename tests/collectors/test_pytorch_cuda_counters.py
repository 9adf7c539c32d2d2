"""The PyTorch collector's CUDA logic, at its gate, with allocator states recorded on GPUs."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memdoc.collectors.frameworks import ArtifactDir, IntervalPeak
from memdoc.collectors.pytorch import CUDA_STATUS_NAME, OOM_CLAIM_WINDOW_S, TorchCollector
from memdoc.collectors.torch_cuda import TorchCudaGate, cuda_counters
from memdoc.trace.model import EventKind, SeriesKey
from tests.collectors.framework_helpers import RecordingSession
from tests.collectors.torch_cuda_standin import RecordedCudaGate, nested, recorded_stats

GiB = 1024**3
MiB = 1024**2
PID = 4242
OOM_STATE = recorded_stats("flexgen_opt_oom")["memory_stats"]
RUN_STATE = recorded_stats("flexgen_opt_1.3b")["memory_stats"]
GRAPHS_STATE = recorded_stats("vllm_private_pool_oom")["memory_stats"]
T0 = 1_000_000.0


def key(quantity: str, device: int = 0) -> SeriesKey:
    return SeriesKey(f"torch.{quantity}", device, PID)


_open: list[TorchCollector] = []


def started(
    gate: RecordedCudaGate, tmp_path: Path | None = None, **options: Any
) -> tuple[TorchCollector, RecordingSession]:
    files = ArtifactDir(tmp_path) if tmp_path is not None else None
    collector = TorchCollector(
        gate=gate, files=files, environ=options.pop("environ", {}), **options
    )
    collector._pid = PID
    session = RecordingSession()
    collector.start(session)
    _open.append(collector)
    return collector, session


@pytest.fixture(autouse=True)
def _close_collectors() -> Iterator[None]:
    """Collectors register a global optimizer hook when torch is loaded: take it away again."""
    yield
    while _open:
        _open.pop().close()


# -- counters -------------------------------------------------------------------------------


def test_a_recorded_oom_state_becomes_the_documented_series_with_exact_byte_values() -> None:
    collector, _ = started(RecordedCudaGate({0: OOM_STATE}))

    values = collector.sample(T0)

    assert values[key("allocated")] == 11_840_159_744
    assert values[key("reserved")] == 11_844_714_496
    assert values[key("active")] == 11_840_159_744
    assert values[key("inactive_split")] == 1_163_264 + 3_391_488
    assert values[key("num_ooms")] == 1
    assert values[key("num_alloc_retries")] == 1
    # A PyTorch that does not report private pools leaves the series out: missing, not 0.
    assert key("private_pool") not in values


def test_private_pool_bytes_are_read_when_pytorch_reports_them() -> None:
    collector, _ = started(RecordedCudaGate({0: GRAPHS_STATE}))

    values = collector.sample(T0)

    assert values[key("private_pool")] == 46 * MiB
    assert values[key("reserved")] - values[key("allocated")] == int(736.86 * MiB)


def test_an_empty_statistics_dict_is_not_read_as_zero_memory() -> None:
    assert cuda_counters({}) is None
    assert cuda_counters(nested(RUN_STATE)) is not None


def test_devices_the_program_never_allocated_on_stay_out_of_the_trace_until_it_does() -> None:
    unused = {k: 0 for k in RUN_STATE if not k.startswith("max_split")}
    gate = RecordedCudaGate({0: RUN_STATE, 1: unused})
    collector, _ = started(gate)

    first = collector.sample(T0)
    gate.set_stats(1, reserved_bytes__all__current=2 * GiB, reserved_bytes__all__peak=2 * GiB)
    before_rescan = collector.sample(T0 + 0.1)
    after_rescan = collector.sample(T0 + 1.1)

    assert key("reserved", 0) in first and key("reserved", 1) not in first
    assert key("reserved", 1) not in before_rescan
    assert after_rescan[key("reserved", 1)] == 2 * GiB


def test_the_oom_counter_follows_each_failed_allocation() -> None:
    gate = RecordedCudaGate({0: RUN_STATE})
    collector, _ = started(gate)
    collector.sample(T0)

    gate.fail_allocation(0, 4 * GiB)
    gate.fail_allocation(0, 2 * GiB)

    assert collector.sample(T0 + 0.1)[key("num_ooms")] == 2


# -- interval peaks -------------------------------------------------------------------------


def test_a_spike_between_two_samples_is_kept_exactly_from_the_all_time_peak() -> None:
    gate = RecordedCudaGate({0: RUN_STATE})
    collector, _ = started(gate)
    collector.sample(T0)

    # Between the samples the program allocates up to the OOM run's level and frees again.
    gate.set_stats(0, allocated_bytes__all__peak=11_840_159_744)
    values = collector.sample(T0 + 0.1)

    assert values[key("allocated")] == 5_683_450_880
    assert values[key("allocated_peak")] == 11_840_159_744


def test_without_a_new_all_time_peak_the_interval_peak_is_the_higher_of_two_samples() -> None:
    gate = RecordedCudaGate({0: RUN_STATE})
    collector, _ = started(gate)
    collector.sample(T0)

    gate.set_stats(0, allocated_bytes__all__current=3 * GiB)
    falling = collector.sample(T0 + 0.1)
    flat = collector.sample(T0 + 0.2)

    assert falling[key("allocated_peak")] == 5_683_450_880
    assert flat[key("allocated_peak")] == 3 * GiB


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param([(5, 9)], [9], id="first-sample-reports-the-peak-so-far"),
        pytest.param([(5, 9), (5, 12)], [9, 12], id="new-all-time-high-is-exact"),
        pytest.param([(5, 9), (7, 9)], [9, 7], id="no-new-high-takes-current"),
        pytest.param([(5, 9), (2, 9)], [9, 5], id="falling-keeps-previous-current"),
        pytest.param([(6, 9), (2, 3)], [9, 6], id="program-reset-its-peak"),
        pytest.param([(6, None), (4, None)], [6, 6], id="no-peak-counter"),
    ],
)
def test_interval_peak_from_current_and_all_time_peak(
    samples: list[tuple[int, int | None]], expected: list[int]
) -> None:
    peaks = IntervalPeak()
    assert [peaks.update(current, alltime) for current, alltime in samples] == expected


def test_the_gate_has_no_way_to_reset_counters_the_program_may_read() -> None:
    assert not [name for name in dir(TorchCudaGate) if "reset" in name or "empty" in name]


# -- CUDA initialisation ------------------------------------------------------------------


def test_nothing_is_asked_of_cuda_until_the_program_initialises_it() -> None:
    gate = RecordedCudaGate({0: RUN_STATE}, initialised=False)
    collector, session = started(gate)

    waiting = [collector.sample(T0 + i / 10) for i in range(3)]
    gate.initialised = True
    running = collector.sample(T0 + 1)

    assert waiting == [{}, {}, {}]
    assert len(session.kinds(EventKind.ALLOCATOR_CONFIG)) == 1  # once CUDA started, not before
    assert gate.calls[: gate.calls.index("device_count")] == []
    assert gate.violations == []
    assert [(s.name, s.available) for s in session.statuses] == [
        (CUDA_STATUS_NAME, False),
        (CUDA_STATUS_NAME, True),
    ]
    assert "not initialised" in (session.statuses[0].reason or "")
    assert running[key("reserved")] == 7_608_467_456
    framework = session.kinds(EventKind.FRAMEWORK)[-1]
    assert framework["devices"] == [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "total_bytes": 16 * GiB}
    ]


def test_allocator_backend_and_a_memory_fraction_reach_the_allocator_config() -> None:
    gate = RecordedCudaGate({0: RUN_STATE}, fractions={0: 0.5}, backend="cudaMallocAsync")
    collector, session = started(gate, environ={"PYTORCH_ALLOC_CONF": "expandable_segments:True"})

    collector.sample(T0)

    conf = session.kinds(EventKind.ALLOCATOR_CONFIG)[-1]
    assert conf["backend"] == "cudaMallocAsync"
    assert conf["memory_fraction"] == 0.5
    assert conf["expandable_segments"] is True


def test_a_fraction_set_by_the_program_mid_run_is_recorded_once() -> None:
    gate = RecordedCudaGate({0: RUN_STATE})
    collector, session = started(gate)
    collector.sample(T0)

    gate.fractions[0] = 0.25
    for i in range(1, 4):
        collector.sample(T0 + 1.1 * i)

    confs = session.kinds(EventKind.ALLOCATOR_CONFIG)
    assert [c.get("memory_fraction") for c in confs] == [None, 0.25]


def test_a_cuda_error_switches_off_cuda_sampling_with_a_reason_and_never_raises() -> None:
    gate = RecordedCudaGate({0: RUN_STATE})
    collector, session = started(gate)
    collector.sample(T0)

    gate.break_with(RuntimeError("CUDA error: an illegal memory access was encountered"))
    after = [collector.sample(T0 + 0.1 * i) for i in range(1, 4)]

    assert after == [{}, {}, {}]
    status = session.statuses[-1]
    assert (status.name, status.available) == (CUDA_STATUS_NAME, False)
    assert "illegal memory access" in (status.reason or "")


# -- OOM capture ----------------------------------------------------------------------------


def test_an_oom_the_program_catches_is_recorded_as_handled_with_the_allocator_state() -> None:
    gate = RecordedCudaGate({0: OOM_STATE}, total_bytes=int(15.77 * GiB), free_bytes=300 * MiB)
    collector, session = started(gate)
    now = time.time()  # the observer stamps the OOM with the real clock
    collector.sample(now)

    gate.fail_allocation(0, 1_073_741_824)
    collector.sample(now + 0.1)
    assert session.kinds(EventKind.OOM) == []  # an uncaught exception may still claim it

    collector.sample(now + OOM_CLAIM_WINDOW_S + 10)
    (oom,) = session.kinds(EventKind.OOM)
    assert oom["handled"] is True
    assert oom["oom"]["framework"] == "pytorch"
    assert oom["oom"]["requested_bytes"] == 1_073_741_824
    assert oom["oom"]["total_bytes"] == int(15.77 * GiB)
    assert oom["oom"]["free_bytes"] == 300 * MiB
    assert oom["stats"]["allocated_bytes"] == 11_840_159_744
    assert oom["stats"]["reserved_bytes"] == 11_844_714_496
    assert oom["stats"]["inactive_split_bytes"] == 4_554_752
    assert oom["stats"]["num_ooms"] == 2


def test_an_oom_that_reaches_the_top_is_recorded_once_with_the_observers_statistics() -> None:
    gate = RecordedCudaGate({0: OOM_STATE})
    collector, session = started(gate)
    collector.sample(T0)

    gate.fail_allocation(0, 2 * GiB)
    context = collector.oom_context(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    collector.sample(time.time() + OOM_CLAIM_WINDOW_S + 10)
    collector.close()

    assert context is not None
    assert context["stats"]["reserved_bytes"] == 11_844_714_496
    assert session.kinds(EventKind.OOM) == []  # the session's own OOM event carries it


def test_under_a_memory_fraction_the_observer_reports_the_allowed_maximum_as_the_limit() -> None:
    gate = RecordedCudaGate({0: RUN_STATE}, total_bytes=80 * GiB, fractions={0: 0.5})
    collector, session = started(gate)
    collector.sample(T0)

    gate.fail_allocation(0, GiB)
    collector.close()

    (oom,) = session.kinds(EventKind.OOM)
    assert oom["oom"]["limit_bytes"] == 40 * GiB
    assert "total_bytes" not in oom["oom"]
    assert oom["stats"]["memory_fraction"] == 0.5


@pytest.mark.parametrize(
    ("message", "device"),
    [
        pytest.param(
            "CUDA out of memory. Tried to allocate 546.00 MiB. GPU 1 has a total capacity of "
            "15.77 GiB of which 514.19 MiB is free.",
            1,
            id="device-named-in-the-message",
        ),
        pytest.param("CUDA out of memory.", 0, id="no-device-named"),
    ],
)
def test_an_unobserved_oom_gets_the_statistics_of_the_device_it_names(
    message: str, device: int
) -> None:
    gate = RecordedCudaGate({0: RUN_STATE, 1: GRAPHS_STATE})
    collector, _ = started(gate)
    collector.sample(T0)

    context = collector.oom_context(RuntimeError(message))

    assert context is not None
    assert context["stats"]["device"] == device


def test_exceptions_that_are_not_cuda_ooms_get_no_pytorch_context() -> None:
    collector, _ = started(RecordedCudaGate({0: RUN_STATE}))
    collector.sample(T0)

    assert collector.oom_context(ValueError("bad shape")) is None
    assert collector.oom_context(MemoryError()) is None


# -- allocation history ---------------------------------------------------------------------


def test_with_recording_on_snapshots_are_saved_beside_the_trace_at_oom_mark_and_end(
    tmp_path: Path,
) -> None:
    gate = RecordedCudaGate({0: RUN_STATE})
    collector, session = started(gate, tmp_path, record_allocations=True)
    collector.sample(T0)

    gate.fail_allocation(0, GiB)
    collector.on_mark("eval", {"snapshot": True})
    collector.on_mark("epoch", {})
    collector.close()

    assert gate.history == [100_000, None]  # on at CUDA init, off at the end
    snapshots = session.kinds(EventKind.SNAPSHOT)
    assert [s["reason"] for s in snapshots] == ["oom", "mark", "end"]
    assert snapshots[1]["label"] == "eval"
    for snapshot in snapshots:
        path = tmp_path / snapshot["path"]
        assert not Path(snapshot["path"]).is_absolute()
        assert pickle.loads(path.read_bytes())["segments"] == []


@pytest.mark.parametrize(
    ("environ", "option", "recording"),
    [
        pytest.param({}, None, False, id="off-by-default"),
        pytest.param({"MEMDOC_RECORD_ALLOCATIONS": "1"}, None, True, id="on-by-environment"),
        pytest.param({"MEMDOC_RECORD_ALLOCATIONS": "1"}, False, False, id="option-wins"),
    ],
)
def test_allocation_recording_is_opt_in(
    environ: dict[str, str], option: bool | None, recording: bool, tmp_path: Path
) -> None:
    gate = RecordedCudaGate({0: RUN_STATE})
    collector, session = started(gate, tmp_path, environ=environ, record_allocations=option)
    collector.sample(T0)
    collector.on_mark("eval", {"snapshot": True})

    assert bool(gate.history) is recording
    assert bool(session.kinds(EventKind.SNAPSHOT)) is recording
