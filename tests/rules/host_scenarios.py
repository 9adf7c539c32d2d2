"""Recorded runs without a GPU, and ranks sharing one: builders of more rule fixtures.

The host numbers (RAM, address-space caps, resident memory, failed requests, stacks) are the
ones `memdoc run` recorded for the CPU scenarios of examples/ on a 23.5 GiB host, where each
script caps its own address space (RLIMIT_AS) to fail fast; see tests/fixtures/rules/SOURCES.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memdoc.trace import EventKind, Metric, OomInfo, ProcessUsage, SeriesKey
from tests.rules.recorder import PID, GiB, MiB, Recorder, torch_key, train_steps

HOST_RAM = 25_275_990_016
H200 = 143771 * MiB
RANK_PIDS = (5101, 5102, 5103, 5104)
_CPU_ALLOCATOR = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
    "allocate memory: you tried to allocate {} bytes. Error code 12 (Cannot allocate memory)"
)
_MODULE_CALL = (
    "site-packages/torch/nn/modules/module.py:1778:_wrapped_call_impl",
    "site-packages/torch/nn/modules/module.py:1789:_call_impl",
)
FORWARD = (
    "train.py:68:main",
    *_MODULE_CALL,
    "site-packages/torch/nn/modules/container.py:253:forward",
    *_MODULE_CALL,
    "site-packages/torch/nn/modules/activation.py:143:forward",
    "site-packages/torch/nn/functional.py:1771:relu",
)
BUILD_UNDER_DEVICE = (
    "train.py:78:main",
    "train.py:39:__init__",
    "train.py:30:__init__",
    "site-packages/torch/nn/modules/linear.py:109:__init__",
    "site-packages/torch/utils/_device.py:122:__torch_function__",
)
FORWARD_UNDER_DEVICE = (
    *FORWARD[:-1],
    "site-packages/torch/utils/_device.py:122:__torch_function__",
)
ADAM_STATE = (
    "train.py:64:main",
    "site-packages/torch/optim/optimizer.py:530:wrapper",
    "site-packages/torch/optim/adam.py:238:step",
    "site-packages/torch/optim/adam.py:182:_init_group",
)
SHAPE_BUG = ("train.py:30:main", "site-packages/torch/nn/functional.py:4315:mse_loss")
EVALUATE = (
    "train.py:86:main",
    "train.py:55:evaluate",
    *_MODULE_CALL,
    "site-packages/torch/nn/modules/container.py:253:forward",
    "site-packages/torch/nn/modules/normalization.py:228:forward",
    "site-packages/torch/nn/functional.py:2987:layer_norm",
)
JAX_RESULT_READ = (
    "train.py:58:main",
    "site-packages/jax/_src/array.py:334:__format__",
    "site-packages/jax/_src/array.py:623:_value",
)


def _torch_cpu_oom(requested: int) -> OomInfo:
    return OomInfo(
        framework="pytorch",
        kind="host-alloc",
        device_type="cpu",
        requested_bytes=requested,
        message=_CPU_ALLOCATOR.format(requested),
    )


def _host(rec: Recorder, resident: Sequence[tuple[float, float]], rlimit: float | None) -> None:
    """Host RAM, the process's resident memory over time, and its address-space cap."""
    rec.sample(0.1, {SeriesKey(Metric.HOST_TOTAL): HOST_RAM})
    for t, rss in resident:
        values = {SeriesKey(Metric.HOST_RSS): rss, SeriesKey(Metric.HOST_RSS, pid=PID): rss}
        if rlimit is not None and t >= 1.5:
            values[SeriesKey(Metric.HOST_RLIMIT_AS, pid=PID)] = rlimit
        rec.sample(t, values)


def _framework(rec: Recorder, t: float, name: str) -> None:
    rec.event(t, EventKind.FRAMEWORK, name=name, version="2.13.0+cpu" if name == "pytorch" else "")


def torch_host_failure(
    path: Path, *, stack: Sequence[str], requested: int, rlimit: float | None, peak: float
) -> None:
    """A PyTorch CPU job whose first step (or its model) fails an allocation under a cap."""
    rec = Recorder(path)
    _framework(rec, 1.0, "pytorch")
    resident = [(0.5 * i, 13 * MiB + (peak - 13 * MiB) * i / 10) for i in range(1, 11)]
    _host(rec, resident, rlimit)
    rec.oom(5.05, _torch_cpu_oom(requested), stack)
    rec.end(6.0, exit_code=1)


def jax_host_failure(
    path: Path,
    *,
    live_array_bytes: int | None,
    address_space_bytes: float | None = None,
    requested: int = 966_328_320,
) -> None:
    """JAX on the CPU under an address-space cap: one request of 966 MB fails when read."""
    rec = Recorder(path)
    _framework(rec, 1.06, "jax")
    resident = [(0.5, 77 * MiB), (1.0, 186 * MiB), (1.5, 199 * MiB), (1.9, 490 * MiB)]
    _host(rec, [*resident, (2.0, 634 * MiB)], rlimit=2_352_062_464)
    if address_space_bytes is not None:
        rec.sample(2.0, {SeriesKey(Metric.HOST_VMS, pid=PID): address_space_bytes})
    oom = OomInfo(
        framework="jax",
        kind="allocator",
        requested_bytes=requested,
        message=(
            "jax.errors.JaxRuntimeError: INTERNAL: Error dispatching computation: Out of memory "
            f"allocating {requested} bytes."
        ),
    )
    data: dict[str, Any] = {"oom": oom.to_dict(), "stack": list(JAX_RESULT_READ)}
    if live_array_bytes is not None:
        data["live_arrays"] = {"count": 2, "bytes": live_array_bytes, "by_device": {}}
    rec.event(2.07, EventKind.OOM, **data)
    rec.end(2.5, exit_code=1)


def eval_after_training_on_host(
    path: Path, *, resident_at_error: float | None = None, step_rise: float = 40 * MiB
) -> None:
    """Six training steps (a warm-up jump, then flat), then evaluation fails in `evaluate`.

    With `resident_at_error`, the sampler saw nothing of the evaluation (a busy machine) and
    only the process's own reading at the error tells how far memory rose.
    """
    rec = Recorder(path)
    _framework(rec, 0.5, "pytorch")
    rec.sample(0.6, {SeriesKey(Metric.HOST_TOTAL): HOST_RAM})
    plateau = [384, 519, 519, 519, 527, 527, 527]
    t = train_steps(
        rec,
        6,
        baseline=lambda k: plateau[k] * MiB,
        rise=lambda k: step_rise,
        metric=Metric.HOST_RSS,
    )
    oom = _torch_cpu_oom(29_826_048)
    if resident_at_error is None:
        rec.sample(t + 0.05, {SeriesKey(Metric.HOST_RSS): 609 * MiB})
        rec.oom(t + 0.1, oom, EVALUATE)
    else:
        host = {"rss_bytes": int(resident_at_error), "address_space_bytes": int(1286 * MiB)}
        rec.event(t + 0.1, EventKind.OOM, oom=oom.to_dict(), stack=list(EVALUATE), host=host)
    rec.end(t + 1.0, exit_code=1)


def jump_mid_run(path: Path) -> None:
    """Allocated memory flat, one jump halfway (a new buffer), flat again: not a leak."""
    rec = Recorder(path)
    rec.device(0, H200, "NVIDIA H200")
    train_steps(
        rec,
        12,
        baseline=lambda k: 40 * GiB if k < 6 else 46 * GiB,
        rise=lambda k: 30 * GiB,
    )
    rec.end(14.0, exit_code=0)


def ranks_on_one_gpu(path: Path, *, crowded: bool) -> None:
    """Four ranks sized for a GPU each: all on GPU 0 (the third fails), or one per GPU."""
    rec = Recorder(path)
    devices = 1 if crowded else 4
    for index in range(devices):
        rec.device(index, H200, "NVIDIA H200")
    share = 0.4 * H200 + 512 * MiB  # the rank's step, sized to 40% of "its" GPU, and a context
    for rank, pid in enumerate(RANK_PIDS[:3] if crowded else RANK_PIDS):
        rec.process(pid)
        device = 0 if crowded else rank
        used = 24 * GiB if crowded and rank == 2 else share
        rec.sample(
            1.0 + rank * 0.1,
            {
                SeriesKey(Metric.GPU_PROC_USED, device, pid): used,
                torch_key(Metric.ALLOCATED, device, pid): used - 512 * MiB,
            },
        )
    if not crowded:
        rec.end(6.0, exit_code=0)
        return
    processes = (
        ProcessUsage(RANK_PIDS[0], int(share)),
        ProcessUsage(RANK_PIDS[1], int(share)),
        ProcessUsage(RANK_PIDS[2], 24 * GiB, this_process=True),
    )
    oom = OomInfo(
        framework="pytorch",
        kind="allocator",
        device=0,
        device_type="gpu",
        requested_bytes=20 * GiB,
        total_bytes=H200,
        free_bytes=int(H200 - 2 * share - 24 * GiB),
        allocated_bytes=23 * GiB,
        processes=processes,
    )
    rec.event(2.0, EventKind.OOM, pid=RANK_PIDS[2], oom=oom.to_dict(), stack=list(FORWARD))
    rec.end(3.0, exit_code=1)


def _torch(
    stack: Sequence[str], requested: int, rlimit: float | None = 1_419_857_920
) -> Callable[[Path], None]:
    return lambda p: torch_host_failure(
        p, stack=stack, requested=requested, rlimit=rlimit, peak=700 * MiB
    )


HOST_SCENARIOS: dict[str, Callable[[Path], None]] = {
    "host-oom/hit-symptom-of-a-host-only-run.memdoc": _torch(FORWARD, 89_478_400),
    "activations-too-large/hit-first-forward-on-host.memdoc": _torch(FORWARD, 89_478_400),
    "activations-too-large/miss-host-failure-outside-a-step.memdoc": _torch(ADAM_STATE, 4 * MiB),
    "model-too-large/hit-built-under-device-context.memdoc": _torch(BUILD_UNDER_DEVICE, 4 * MiB),
    "model-too-large/miss-device-context-in-forward.memdoc": _torch(FORWARD_UNDER_DEVICE, 4 * MiB),
    "optimizer-state/hit-init-group-first-step.memdoc": _torch(ADAM_STATE, 4 * MiB),
    "single-allocation-too-large/hit-beyond-host-ram.memdoc": _torch(
        SHAPE_BUG, 274_877_906_944, rlimit=None
    ),
    "single-allocation-too-large/miss-small-host-request.memdoc": _torch(ADAM_STATE, 4 * MiB),
    "single-allocation-too-large/hit-jax-request-above-all-data.memdoc": lambda p: jax_host_failure(
        p, live_array_bytes=None
    ),
    "xla-temp-buffers/hit-request-far-above-live-arrays.memdoc": lambda p: jax_host_failure(
        p, live_array_bytes=186_516
    ),
    "xla-temp-buffers/hit-weak-request-near-live-arrays.memdoc": lambda p: jax_host_failure(
        p, live_array_bytes=241_582_080
    ),
    "eval-without-no-grad/hit-evaluate-frame-after-training.memdoc": eval_after_training_on_host,
    "leak-across-steps/miss-warmup-then-plateau.memdoc": eval_after_training_on_host,
    "leak-across-steps/miss-one-jump-mid-run.memdoc": jump_mid_run,
    "wrong-device/hit-ranks-crowd-gpu0.memdoc": lambda p: ranks_on_one_gpu(p, crowded=True),
    "wrong-device/miss-ranks-on-their-own-gpus.memdoc": lambda p: ranks_on_one_gpu(
        p, crowded=False
    ),
}
