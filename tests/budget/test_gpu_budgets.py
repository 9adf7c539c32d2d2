"""Budgets on a GPU, from allocator counters: the PyTorch collector reads them through its
CUDA gate (here a stand-in fed with an allocator state recorded on a real GPU, see
tests/fixtures/cuda_memory_stats/SOURCES.md), the trace is written by the real writer, and
`memdoc compare` and the pytest plugin's judge read the same figures from it, exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memdoc.budget.compare import compare, parse_budget
from memdoc.budget.figures import GROWTH_PER_STEP, PEAK_HELD, PEAK_USED, run_figures
from memdoc.budget.testing import judge, measure, parse_limits
from memdoc.collectors.pytorch import TorchCollector
from memdoc.trace import load_trace
from tests.collectors.framework_helpers import RecordingSession
from tests.collectors.torch_cuda_standin import RecordedCudaGate, recorded_stats
from tests.rules.recorder import MiB, Recorder

STATE = recorded_stats("flexgen_opt_1.3b")["memory_stats"]  # OPT-1.3B serving, one GPU
ALLOCATED = STATE["allocated_bytes.all.current"]
RESERVED = STATE["reserved_bytes.all.current"]
STEPS = 20

_open: list[TorchCollector] = []


@pytest.fixture(autouse=True)
def _close_collectors() -> Iterator[None]:
    """A collector registers a global optimizer hook when torch is loaded: take it away."""
    yield
    while _open:
        _open.pop().close()


def recorded_run(
    path: Path,
    *,
    kept_per_step: int = 0,
    spike: int = 0,
    card: str = "NVIDIA H100 80GB HBM3",
) -> Path:
    """STEPS training steps on GPU 0: each step allocates `spike` more than the recorded
    state for a moment (its activations), frees it, and keeps `kept_per_step` (a leak)."""
    gate = RecordedCudaGate({0: STATE})
    collector = TorchCollector(gate=gate, environ={})
    _open.append(collector)
    collector.start(RecordingSession())
    rec = Recorder(path)
    collector._pid = rec.pid
    rec.device(0, 80 * 1024**3, card)
    allocated, peak = ALLOCATED, STATE["allocated_bytes.all.peak"]
    rec.sample(0.05, dict(collector.sample(rec.t0 + 0.05)))  # when the test began
    for step in range(1, STEPS + 1):
        t = step * 0.5
        peak = max(peak, allocated + spike)
        allocated += kept_per_step
        reserved = max(RESERVED, peak)
        gate.set_stats(
            0,
            allocated_bytes__all__current=allocated,
            allocated_bytes__all__peak=peak,
            reserved_bytes__all__current=reserved,
            reserved_bytes__all__peak=reserved,
        )
        rec.sample(t - 0.01, dict(collector.sample(rec.t0 + t - 0.01)))
        rec.step(t, step)
    rec.end(STEPS * 0.5 + 0.5, exit_code=0)
    return path


def test_the_figures_on_the_gpu_are_the_allocator_counters_exactly(tmp_path: Path) -> None:
    spike = 512 * MiB
    trace = load_trace(recorded_run(tmp_path / "base.memdoc", spike=spike))
    gpu = run_figures([trace]).places["gpu0"]

    # The interval peaks carry the all-time peak the allocator counted between samples.
    assert gpu.figures[PEAK_USED] == max(STATE["allocated_bytes.all.peak"], ALLOCATED + spike)
    assert gpu.figures[PEAK_HELD] == max(RESERVED, ALLOCATED + spike)
    assert gpu.figures[GROWTH_PER_STEP] == 0
    assert gpu.device_name == "NVIDIA H100 80GB HBM3"


def test_a_leak_of_one_mib_a_step_fails_compare_on_the_gpu_and_a_rerun_does_not(
    tmp_path: Path,
) -> None:
    base = run_figures([load_trace(recorded_run(tmp_path / "base.memdoc"))])
    again = run_figures([load_trace(recorded_run(tmp_path / "again.memdoc"))])
    leak = run_figures([load_trace(recorded_run(tmp_path / "leak.memdoc", kept_per_step=MiB))])
    budget = parse_budget(["growth_per_step=0"])

    assert not compare(base, again, budget).over  # counters: the same run, the same bytes
    over = compare(base, leak, budget).over
    assert [(r.place, r.figure) for r in over] == [("gpu0", GROWTH_PER_STEP)]
    assert over[0].new == MiB


def test_another_card_is_compared_on_allocated_bytes_only(tmp_path: Path) -> None:
    h100 = run_figures([load_trace(recorded_run(tmp_path / "h100.memdoc"))])
    a100 = run_figures(
        [load_trace(recorded_run(tmp_path / "a100.memdoc", card="NVIDIA A100-SXM4-40GB"))]
    )
    compared = compare(h100, a100, parse_budget(["5%"]))

    assert {r.figure for r in compared.rows if r.place == "gpu0"} == {PEAK_USED}
    assert any("A100" in note and "allocated" in note for note in compared.notes)


@pytest.mark.parametrize(("kept_per_step", "passed"), [(MiB, False), (0, True)])
def test_the_plugins_growth_budget_is_exact_on_allocator_counters(
    tmp_path: Path, kept_per_step: int, passed: bool
) -> None:
    trace = load_trace(recorded_run(tmp_path / "run.memdoc", kept_per_step=kept_per_step))
    limits = parse_limits((), {"growth_per_step": "0 B", "warmup": 2})

    verdict = judge(measure(trace, limits.warmup), limits)

    assert verdict.passed is passed  # no host tolerance: one MiB a step is over "0 B"


@pytest.mark.parametrize(("spike", "passed"), [(600 * MiB, False), (400 * MiB, True)])
def test_the_plugins_peak_is_what_the_test_added_on_the_device(
    tmp_path: Path, spike: int, passed: bool
) -> None:
    # The process held the recorded state when the test began; the test's steps each rise
    # by `spike` above it. A 500 MiB budget is kept on that rise, exactly.
    trace = load_trace(recorded_run(tmp_path / "run.memdoc", spike=spike))
    limits = parse_limits((), {"peak": "500 MiB"})
    measured = measure(trace, limits.warmup)

    assert judge(measured, limits).passed is passed
