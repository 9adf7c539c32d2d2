"""What evaluation kept on a GPU: the loop's phase marks read the live tensors on the CUDA
device (through the CUDA gate, here a stand-in fed with allocator states recorded on real
GPUs), and a GPU OOM's evaluation finding is measured there, not in host memory, which
logits kept on the device never touch."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.collectors.loops import hub
from memdoc.collectors.torch_cuda import device_memory
from memdoc.rules.engine import diagnose
from memdoc.trace import OomInfo, SeriesKey, load_trace
from memdoc.trace.phases import phases
from tests.collectors.torch_cuda_standin import RecordedCudaGate, recorded_stats
from tests.rules.recorder import GiB, MiB, Recorder

OPT = "flexgen_opt_1.3b"  # tests/fixtures/cuda_memory_stats: see SOURCES.md there


def test_a_phase_mark_reads_the_live_tensors_on_the_current_device_through_the_gate() -> None:
    state = recorded_stats(OPT)["memory_stats"]
    gate = RecordedCudaGate({0: state})
    assert device_memory(gate) == {
        "index": 0,
        "allocated_bytes": state["allocated_bytes.all.current"],
    }
    gate.set_stats(0, allocated_bytes__all__current=state["allocated_bytes.all.current"] + GiB)
    assert device_memory(gate)["allocated_bytes"] == state["allocated_bytes.all.current"] + GiB
    # Before the program initialised CUDA, nothing is asked of it.
    quiet = RecordedCudaGate({0: state}, initialised=False)
    assert device_memory(quiet) == {} and quiet.violations == []


def test_the_hub_puts_the_device_reading_in_every_phase_mark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = RecordedCudaGate({0: recorded_stats(OPT)["memory_stats"]})
    monkeypatch.setattr(hub, "device_reader", lambda: device_memory(gate))
    marks: list[dict[str, object]] = []

    class Session:
        def emit(self, kind: str, data: dict[str, object]) -> None:
            marks.append(data)

    session = Session()
    hub.subscribe(session)  # type: ignore[arg-type]
    try:
        hub.enter(hub.EVAL, "test", grad_enabled=False)
        hub.leave(hub.EVAL, "test")
    finally:
        hub.unsubscribe(session)  # type: ignore[arg-type]
    assert [m["label"] for m in marks] == [hub.EVAL, hub.PHASE_ENDED]
    assert all(m["device"] == device_memory(gate) for m in marks)


@pytest.mark.parametrize(("kept_per_pass", "named"), [(600 * MiB, True), (0, False)])
def test_evaluation_that_keeps_logits_on_the_gpu_is_found_on_the_device(
    tmp_path: Path, kept_per_pass: int, named: bool
) -> None:
    # Three train/eval rounds on GPU 0; each evaluation pass keeps `kept_per_pass` of logits
    # on the device (host memory stays flat), and the fourth evaluation runs out there.
    path = tmp_path / "run.memdoc"
    rec = Recorder(path)
    rec.device(0, 80 * GiB, "NVIDIA H100 80GB HBM3")
    host = {"rss_bytes": 3 * GiB, "address_space_bytes": 40 * GiB}
    allocated, t, step = 20 * GiB, 1.0, 0
    for _ in range(4):
        device = {"index": 0, "allocated_bytes": allocated}
        rec.mark(t, "train", phase="train", source="lightning", host=host, device=device)
        for _ in range(5):
            step += 1
            t += 0.2
            rec.sample(t - 0.1, {SeriesKey("torch.allocated", 0, rec.pid): allocated})
            rec.step(t, step)
        device = {"index": 0, "allocated_bytes": allocated}
        rec.mark(
            t + 0.1,
            "eval",
            phase="eval",
            source="lightning",
            grad_enabled=False,
            host=host,
            device=device,
        )
        allocated += kept_per_pass
        t += 1.0
    oom = OomInfo(
        framework="pytorch",
        device=0,
        device_type="gpu",
        requested_bytes=2 * GiB,
        total_bytes=80 * GiB,
        message="torch.OutOfMemoryError: CUDA out of memory.",
    )
    rec.oom(t, oom, ("train.py:40:validation_step",))
    rec.end(t + 0.5, exit_code=1)
    trace = load_trace(path)
    assert [p.kept_on_device for p in phases(trace) if p.evaluating][:3] == [(0, kept_per_pass)] * 3

    leak = [f for f in diagnose(trace) if f.rule == "leak-across-steps"]

    assert bool(leak and leak[0].summary.startswith("Each evaluation pass kept 600.0 MiB")) is named
    if named:
        assert "not autograd graphs" in leak[0].summary  # the loop evaluated with grad off
    # Host memory stayed flat: resident memory alone would have seen nothing kept.
    assert {p.kept_bytes for p in phases(trace) if p.evaluating and p.t1 < t} == {0}
