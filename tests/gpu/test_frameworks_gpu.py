"""The framework collectors on a real CUDA GPU: counters move, a spike between samples is
kept, a caught OOM is seen by the allocator's observer, and snapshots are saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.trace.model import EventKind
from tests.collectors.framework_helpers import events_of, last_status, run_program

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1024**2
GiB = 1024**3

MOVING = """
    import json, time
    import torch
    import memdoc

    with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
        torch.zeros(1, device="cuda")  # the program initialises CUDA; memdoc starts reading
        time.sleep(0.2)
        x = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        time.sleep(0.3)
        del x
        time.sleep(0.3)
    print("RESULT " + json.dumps({"cuda": torch.cuda.is_initialized()}))
"""


def test_allocated_and_reserved_move_with_a_real_cuda_tensor(tmp_path: Path) -> None:
    run = run_program(tmp_path, MOVING)
    trace = run.trace()

    assert last_status(trace, "pytorch.cuda").available
    (allocated,) = trace.series_for("torch.allocated", device=0)
    (reserved,) = trace.series_for("torch.reserved", device=0)
    assert max(allocated.values) - allocated.values[0] >= 256 * MiB
    assert allocated.values[-1] < 256 * MiB
    assert max(reserved.values) >= 256 * MiB
    framework = events_of(trace, EventKind.FRAMEWORK, name="pytorch")[-1]
    assert framework.data["devices"][0]["total_bytes"] > 0


SPIKE = """
    import json, time
    import torch
    import memdoc

    torch.zeros(1, device="cuda")  # CUDA is initialised by the program, before the block
    with memdoc.watch("run.memdoc", interval=0.5, quiet=True):
        time.sleep(0.7)
        spike = torch.empty(GIB, dtype=torch.uint8, device="cuda")
        del spike  # gone long before the next sample
        torch.cuda.synchronize()
        time.sleep(0.7)
    print("RESULT " + json.dumps({}))
""".replace("GIB", str(GiB))


def test_a_spike_between_two_samples_shows_in_the_interval_peak(tmp_path: Path) -> None:
    trace = run_program(tmp_path, SPIKE).trace()

    (allocated,) = trace.series_for("torch.allocated", device=0)
    (peaks,) = trace.series_for("torch.allocated_peak", device=0)
    assert max(allocated.values) < GiB
    assert max(peaks.values) >= GiB


CAUGHT_OOM = """
    import json, os, time
    import torch
    import memdoc

    with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
        torch.zeros(1, device="cuda")
        time.sleep(0.2)
        free, total = torch.cuda.mem_get_info()
        try:  # a batch-size finder: ask for more than the device has, and carry on
            torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            caught = True
        time.sleep(1.5)
    print("RESULT " + json.dumps({"caught": caught, "total": total}))
"""


def test_an_oom_the_program_catches_is_seen_by_the_allocators_observer(tmp_path: Path) -> None:
    run = run_program(tmp_path, CAUGHT_OOM, env={"MEMDOC_RECORD_ALLOCATIONS": "1"})
    trace = run.trace()

    assert run.result["caught"] is True
    (oom,) = events_of(trace, EventKind.OOM)
    assert oom.data["handled"] is True
    assert oom.data["observed_by"] == "oom_observer"
    assert oom.data["oom"]["requested_bytes"] >= 2 * run.result["total"]
    assert oom.data["stats"]["reserved_bytes"] >= oom.data["stats"]["allocated_bytes"]
    assert oom.data["stats"]["num_ooms"] >= 1
    (ooms,) = trace.series_for("torch.num_ooms", device=0)
    assert max(ooms.values) >= 1
    snapshots = events_of(trace, EventKind.SNAPSHOT, framework="pytorch")
    assert [s.data["reason"] for s in snapshots] == ["oom", "end"]
    for snapshot in snapshots:
        assert (tmp_path / snapshot.data["path"]).stat().st_size > 0


NO_CUDA_USE = """
    import json
    import torch
    import memdoc

    with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
        model = torch.nn.Linear(16, 16)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.ones(4, 16)).sum().backward()
            optimizer.step()
    print("RESULT " + json.dumps({"cuda": torch.cuda.is_initialized()}))
"""


def test_on_a_gpu_machine_memdoc_does_not_initialise_cuda_for_a_cpu_program(
    tmp_path: Path,
) -> None:
    run = run_program(tmp_path, NO_CUDA_USE)

    assert run.result["cuda"] is False
    status = last_status(run.trace(), "pytorch.cuda")
    assert not status.available and "not initialised" in (status.reason or "")
    assert len(run.trace().steps()) == 3


JAX_GPU = """
    import json, time
    import jax, jax.numpy as jnp
    import memdoc

    with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
        if jax.default_backend() != "gpu":
            print("RESULT " + json.dumps({"skip": jax.default_backend()}))
            raise SystemExit(0)
        x = jnp.ones((64 * 1024 * 1024,), jnp.float32).block_until_ready()  # 256 MiB
        time.sleep(0.3)
    print("RESULT " + json.dumps({}))
"""


def test_jax_on_a_gpu_reports_allocator_statistics_and_its_preallocated_pool(
    tmp_path: Path,
) -> None:
    run = run_program(tmp_path, JAX_GPU)
    if "skip" in run.result:
        pytest.skip(f"JAX has no GPU backend here ({run.result['skip']})")
    trace = run.trace()

    (allocated,) = trace.series_for("jax.allocated", device=0)
    (limit,) = trace.series_for("jax.limit", device=0)
    assert max(allocated.values) >= 256 * MiB
    assert limit.values[0] > max(allocated.values)
    conf = events_of(trace, EventKind.ALLOCATOR_CONFIG, framework="jax")[-1]
    assert conf.data["preallocate"] is True and conf.data["platform"] == "gpu"
    for reserved in trace.series_for("jax.reserved", device=0):  # when XLA reports its pool
        assert reserved.values[0] >= 0.5 * limit.values[0]
