"""The recorded runs behind the rule fixtures: one builder per stored .memdoc file.

Device sizes and process footprints are the ones real GPUs reported (nvidia-smi XML in the
shared fixtures; see tests/fixtures/rules/SOURCES.md): RTX A5000 24564 MiB with a
llama-server holding 22430 MiB, Tesla T4 15360 MiB with a python process at 1005 MiB.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memdoc.trace import EventKind, Metric, OomInfo, SeriesKey
from tests.rules.host_scenarios import HOST_SCENARIOS
from tests.rules.recorder import PID, GiB, MiB, Recorder, torch_key, train_steps

A5000 = 24564 * MiB
T4 = 15360 * MiB
H200 = 143771 * MiB
RANK_PIDS = (5101, 5102, 5103, 5104)


def _torch_oom(requested: float, total: float, **fields: object) -> OomInfo:
    return OomInfo(
        framework="pytorch",
        kind="allocator",
        device=0,
        device_type="gpu",
        requested_bytes=int(requested),
        total_bytes=int(total),
        **fields,  # type: ignore[arg-type]
    )


def fragmentation_recorded(path: Path) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    t = train_steps(
        rec, 6, baseline=lambda k: 8 * GiB, rise=lambda k: 6 * GiB, reserved=lambda k: 20 * GiB
    )
    rec.sample(
        t + 0.5, {torch_key(Metric.INACTIVE_SPLIT): 5 * GiB, SeriesKey(Metric.GPU_FREE, 0): 1 * GiB}
    )
    rec.oom(t + 0.6, _torch_oom(4 * GiB, A5000))
    rec.end(t + 1, exit_code=1)


def other_process_recorded(path: Path) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    rec.process(7001, ours=False, command=("/root/src/llama.cpp/build/bin/llama-server",))
    rec.sample(0.5, {SeriesKey(Metric.GPU_PROC_USED, 0, 7001): 22430 * MiB})
    rec.sample(
        1.0,
        {SeriesKey(Metric.GPU_PROC_USED, 0, PID): 600 * MiB, torch_key(Metric.RESERVED): 200 * MiB},
    )
    rec.sample(1.5, {SeriesKey(Metric.GPU_USED, 0): 22437 * MiB + 600 * MiB})
    rec.oom(2.0, _torch_oom(2 * GiB, A5000, free_bytes=1678 * MiB - 600 * MiB))
    rec.end(2.5, exit_code=1)


def _ranks_on_device(path: Path, *, shared: bool) -> None:
    rec = Recorder(path, world_size=4)
    for index in range(4):
        rec.device(index, T4, "Tesla T4")
    for rank, pid in enumerate(RANK_PIDS):
        rec.process(pid)
        own = 12 * GiB
        if shared:
            # Every rank creates a context on GPU 0 before selecting its own device.
            footprints = {0: own if rank == 0 else 1005 * MiB}
            if rank:
                footprints[rank] = own
        else:
            footprints = {rank: own}
        rec.sample(
            1.0 + rank * 0.1,
            {SeriesKey(Metric.GPU_PROC_USED, d, pid): b for d, b in footprints.items()},
        )
    if shared:
        rec.oom(3.0, _torch_oom(512 * MiB, T4))
    rec.end(4.0, exit_code=1 if shared else 0)


def wrong_device_recorded(path: Path, *, visible: str | None) -> None:
    env = {"LOCAL_RANK": "2"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    rec = Recorder(path, env=env, rank=2, world_size=4)
    for index in range(4 if visible is None else 1):
        rec.device(index, T4, "Tesla T4")
    train_steps(rec, 3, baseline=lambda k: 4 * GiB, rise=lambda k: 2 * GiB)
    rec.end(5.0, exit_code=0)


def preallocation_recorded(path: Path) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    rec.event(0.5, EventKind.FRAMEWORK, name="tensorflow", version="2.15.0")
    rec.sample(
        1.0,
        {SeriesKey("tf.limit", 0, PID): int(A5000 * 0.93), SeriesKey("tf.allocated", 0, PID): 0},
    )
    oom = OomInfo(
        framework="tensorflow",
        kind="disguised",
        device_type="gpu",
        library="cudnn",
        message="Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR",
    )
    rec.oom(3.0, oom)
    rec.end(3.5, exit_code=1)


def growth_without_preallocation(path: Path) -> None:
    rec = Recorder(path, env={"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    rec.device(0, A5000, "NVIDIA RTX A5000")
    rec.event(0.5, EventKind.FRAMEWORK, name="tensorflow", version="2.15.0")
    for i in range(1, 8):
        rec.sample(i * 1.0, {SeriesKey("tf.reserved", 0, PID): i * 2 * GiB})
    rec.oom(
        8.0, OomInfo(framework="tensorflow", kind="allocator", device=0, shape=(512, 64, 56, 56))
    )
    rec.end(8.5, exit_code=1)


def two_frameworks(path: Path, *, second_device: int) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    rec.sample(1.0, {torch_key(Metric.ALLOCATED): 2 * GiB, torch_key(Metric.RESERVED): 3 * GiB})
    second = "jax" if second_device >= 0 else "tf"
    rec.sample(1.5, {SeriesKey(f"{second}.reserved", second_device, PID): 15 * GiB})
    rec.end(3.0, exit_code=0)


def fraction_cap_recorded(path: Path) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    rec.event(0.2, EventKind.ALLOCATOR_CONFIG, framework="pytorch", memory_fraction=0.5)
    rec.sample(
        1.0,
        {
            torch_key(Metric.RESERVED): 11.8 * GiB,
            torch_key(Metric.ALLOCATED): 11.5 * GiB,
            SeriesKey(Metric.GPU_FREE, 0): 11 * GiB,
        },
    )
    rec.oom(2.0, _torch_oom(1 * GiB, A5000))
    rec.end(2.5, exit_code=1)


def leak_on_gpu(path: Path) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    t = train_steps(rec, 30, baseline=lambda k: 6 * GiB + k * 120 * MiB, rise=lambda k: 3 * GiB)
    rec.oom(t + 0.5, _torch_oom(3 * GiB, A5000))
    rec.end(t + 1, exit_code=1)


def leak_on_host(path: Path) -> None:
    rec = Recorder(path)
    rec.sample(0.1, {SeriesKey(Metric.HOST_TOTAL): 64 * GiB})
    train_steps(
        rec,
        20,
        baseline=lambda k: 2 * GiB + k * 40 * MiB,
        rise=lambda k: 300 * MiB,
        metric=Metric.HOST_RSS,
    )
    rec.end(25.0, exit_code=0)


def flat_with_noise(path: Path) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    jitter = [0, 40, -30, 10, -50, 20, 0, -20, 30, -10, 50, -40, 0, 10, -30, 20, -10, 0, 40, -20]
    train_steps(rec, 20, baseline=lambda k: 6 * GiB + jitter[k % 20] * MiB, rise=lambda k: 3 * GiB)
    rec.end(25.0, exit_code=0)


def _eval_run(path: Path, *, eval_rise: float) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    t = train_steps(rec, 6, baseline=lambda k: 4 * GiB, rise=lambda k: 6 * GiB)
    rec.mark(t + 0.1, "eval")
    for i in range(1, 5):
        rec.sample(t + 0.1 + i * 0.2, {torch_key(Metric.ALLOCATED): 4 * GiB + eval_rise * i / 4})
    rec.sample(t + 1.2, {torch_key(Metric.ALLOCATED): 4 * GiB})
    rec.mark(t + 1.3, "train")
    rec.end(t + 2, exit_code=0)


def activations_recorded(path: Path, *, fail: bool) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    rise = 17 * GiB if fail else 2 * GiB
    t = train_steps(rec, 4, baseline=lambda k: 5 * GiB, rise=lambda k: rise)
    if fail:
        rec.sample(t + 0.4, {torch_key(Metric.ALLOCATED): 23.5 * GiB})
        rec.oom(t + 0.5, _torch_oom(1 * GiB, A5000))
    rec.end(t + 1, exit_code=1 if fail else 0)


def activations_on_host(path: Path) -> None:
    """A CPU-only job: each step's working set in RAM, then a failed host allocation."""
    rec = Recorder(path)
    rec.sample(0.1, {SeriesKey(Metric.HOST_TOTAL): 16 * GiB})
    t = train_steps(
        rec, 4, baseline=lambda k: 2 * GiB, rise=lambda k: 12 * GiB, metric=Metric.HOST_RSS
    )
    rec.sample(t + 0.4, {SeriesKey(Metric.HOST_RSS): 15.2 * GiB})
    message = "RuntimeError: DefaultCPUAllocator: can't allocate memory"
    oom = OomInfo(framework="pytorch", kind="host-alloc", device_type="cpu", message=message)
    rec.oom(t + 0.5, oom)
    rec.end(t + 1, exit_code=1)


def model_state_run(
    path: Path, *, param_bytes: float, fail_before_step: bool, total: int = T4
) -> None:
    rec = Recorder(path)
    rec.device(0, total, "Tesla T4")
    rec.event(
        0.5,
        EventKind.MODEL_STATE,
        framework="pytorch",
        device=0,
        param_bytes=int(param_bytes),
        grad_bytes=0,
        phase="init",
    )
    rec.sample(1.0, {torch_key(Metric.ALLOCATED): param_bytes})
    if fail_before_step:
        rec.oom(1.5, _torch_oom(512 * MiB, total))
        rec.end(2.0, exit_code=1)
        return
    t = train_steps(rec, 5, baseline=lambda k: param_bytes * 2, rise=lambda k: 3 * GiB, t_start=2.0)
    rec.oom(t + 0.5, _torch_oom(6 * GiB, total))
    rec.end(t + 1, exit_code=1)


def optimizer_first_step(path: Path, *, state_ratio: float) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    params = 5 * GiB
    rec.sample(0.5, {torch_key(Metric.ALLOCATED): params})
    rec.event(
        0.6,
        EventKind.MODEL_STATE,
        framework="pytorch",
        device=0,
        param_bytes=params,
        grad_bytes=params,
        optimizer_state_bytes=int(params * state_ratio),
        phase="first_step",
        dtype_bytes={"float32": params},
    )
    if state_ratio >= 1:
        rec.sample(1.0, {torch_key(Metric.ALLOCATED): 2 * params + 3 * GiB})
        rec.oom(1.2, _torch_oom(2 * GiB, A5000))
        rec.end(1.5, exit_code=1)
        return
    train_steps(rec, 4, baseline=lambda k: 2 * params, rise=lambda k: 3 * GiB, t_start=1.0)
    rec.end(6.0, exit_code=0)


def dtype_run(path: Path, *, dtype: str) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    rec.event(
        0.5,
        EventKind.MODEL_STATE,
        framework="pytorch",
        device=0,
        param_bytes=4 * GiB,
        grad_bytes=4 * GiB,
        dtype_bytes={dtype: 4 * GiB},
        phase="init",
    )
    t = train_steps(rec, 3, baseline=lambda k: 8 * GiB, rise=lambda k: 14 * GiB)
    rec.oom(t + 0.5, _torch_oom(2 * GiB, A5000))
    rec.end(t + 1, exit_code=1)


def shapes_run(path: Path, *, varying: bool) -> None:
    rec = Recorder(path)
    rec.device(0, A5000, "NVIDIA RTX A5000")
    lengths = [1.0, 1.6, 0.7, 2.1, 1.2, 2.8, 0.9, 3.4, 1.5, 4.0] if varying else [2.0] * 10
    highs = [max(lengths[: k + 1]) for k in range(10)]
    train_steps(
        rec,
        10,
        baseline=lambda k: 3 * GiB,
        rise=lambda k: lengths[k - 1] * GiB,
        reserved=lambda k: 3 * GiB + highs[k - 1] * 1.25 * GiB,
    )
    rec.end(12.0, exit_code=0)


def load_spike(path: Path, *, spike: bool) -> None:
    rec = Recorder(path)
    rec.device(0, T4, "Tesla T4")
    rec.mark(0.5, "load")
    weights = 5 * GiB
    rec.sample(1.0, {torch_key(Metric.ALLOCATED): weights})
    rec.sample(1.5, {torch_key(Metric.ALLOCATED): 2 * weights if spike else weights})
    rec.sample(2.0, {torch_key(Metric.ALLOCATED): weights})
    train_steps(rec, 3, baseline=lambda k: weights, rise=lambda k: 2 * GiB, t_start=2.1)
    rec.end(6.0, exit_code=0)


def host_killed(path: Path, *, near_limit: bool) -> None:
    rec = Recorder(path)
    limit = 32 * GiB
    for i in range(1, 11):
        rss = (i / 10) * (31.4 * GiB if near_limit else 6 * GiB)
        rec.sample(
            i * 0.5, {SeriesKey(Metric.HOST_RSS): rss, SeriesKey(Metric.CGROUP_LIMIT): limit}
        )
    if near_limit:
        rec.end(5.5, signal=9)
    else:
        rec.end(5.5, exit_code=1)


def killed_far_below_the_limit(path: Path, *, kills_counted: bool) -> None:
    """`kill -9` (a person, a timeout) of a job at 110 MiB of a 24 GiB limit."""
    rec = Recorder(path)
    for i in range(1, 6):
        values = {
            SeriesKey(Metric.HOST_RSS): 110 * MiB,
            SeriesKey(Metric.CGROUP_LIMIT): 24 * GiB,
        }
        if kills_counted:
            values[SeriesKey(Metric.CGROUP_OOM_KILLS)] = 0
        rec.sample(i * 0.5, values)
    rec.end(3.0, signal=9)


def cgroup_oom_kill(path: Path) -> None:
    rec = Recorder(path)
    for i, kills in enumerate([0, 0, 0, 1, 1]):
        rec.sample(
            1.0 + i,
            {SeriesKey(Metric.CGROUP_OOM_KILLS): kills, SeriesKey(Metric.HOST_RSS): 12 * GiB},
        )
    rec.event(4.2, EventKind.PROCESS_EXIT, pid=PID + 5, signal=9, command=["python", "worker"])
    rec.end(6.0, exit_code=1)


def private_pool_recorded(path: Path) -> None:
    rec = Recorder(path)
    rec.device(0, H200, "NVIDIA H200")
    rec.sample(
        1.0,
        {
            torch_key(Metric.PRIVATE_POOL): 38 * GiB,
            torch_key(Metric.ALLOCATED): 120 * GiB,
            torch_key(Metric.RESERVED): 136 * GiB,
        },
    )
    rec.oom(2.0, _torch_oom(8 * GiB, H200, allocated_bytes=120 * GiB))
    rec.end(2.5, exit_code=1)


def nccl_outside_pool(path: Path) -> None:
    rec = Recorder(path, env={"NCCL_DEBUG": "WARN"}, rank=0, world_size=8)
    rec.device(0, H200, "NVIDIA H200")
    for i, outside in enumerate([0.5, 0.5, 1.1, 1.7, 1.7]):
        reserved = 20 * GiB
        rec.sample(
            1.0 + i,
            {
                torch_key(Metric.RESERVED): reserved,
                SeriesKey(Metric.GPU_PROC_USED, 0, PID): reserved + outside * GiB,
            },
        )
    rec.end(7.0, exit_code=0)


def rank_trace(
    path: Path, *, rank: int, peak: float, fail_at: float | None, t0_shift: float = 0.0
) -> None:
    rec = Recorder(path, rank=rank, world_size=2, pid=PID + rank, t0=1_764_000_000.0 + t0_shift)
    rec.device(rank, A5000, "NVIDIA RTX A5000")
    train_steps(rec, 4, baseline=lambda k: peak * 0.5, rise=lambda k: peak * 0.5, device=rank)
    if fail_at is not None:
        rec.oom(fail_at, _torch_oom(1 * GiB, A5000))
        rec.end(fail_at + 0.5, exit_code=1)
    else:
        rec.end(8.0, exit_code=0)


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "fragmentation/hit-recorded-cache.memdoc": fragmentation_recorded,
    "other-process/hit-foreign-pid.memdoc": other_process_recorded,
    "cuda-context-overhead/hit-ranks-touch-gpu0.memdoc": lambda p: _ranks_on_device(p, shared=True),
    "cuda-context-overhead/miss-one-rank-per-gpu.memdoc": lambda p: _ranks_on_device(
        p, shared=False
    ),
    "wrong-device/hit-local-rank-on-gpu0.memdoc": lambda p: wrong_device_recorded(p, visible=None),
    "wrong-device/miss-one-visible-gpu.memdoc": lambda p: wrong_device_recorded(p, visible="2"),
    "framework-preallocation/hit-tf-pool-at-start.memdoc": preallocation_recorded,
    "framework-preallocation/miss-growth-on.memdoc": growth_without_preallocation,
    "multi-framework/hit-torch-and-jax-on-gpu0.memdoc": lambda p: two_frameworks(
        p, second_device=0
    ),
    "multi-framework/miss-tf-on-cpu.memdoc": lambda p: two_frameworks(p, second_device=-1),
    "memory-fraction-cap/hit-fraction-set.memdoc": fraction_cap_recorded,
    "leak-across-steps/hit-allocated-grows.memdoc": leak_on_gpu,
    "leak-across-steps/hit-host-rss-grows.memdoc": leak_on_host,
    "leak-across-steps/miss-flat-with-noise.memdoc": flat_with_noise,
    "eval-without-no-grad/hit-eval-as-high-as-train.memdoc": lambda p: _eval_run(
        p, eval_rise=5.5 * GiB
    ),
    "eval-without-no-grad/miss-eval-under-no-grad.memdoc": lambda p: _eval_run(
        p, eval_rise=0.6 * GiB
    ),
    "activations-too-large/hit-step-peaks.memdoc": lambda p: activations_recorded(p, fail=True),
    "activations-too-large/hit-host-step-peaks.memdoc": activations_on_host,
    "activations-too-large/miss-room-to-spare.memdoc": lambda p: activations_recorded(
        p, fail=False
    ),
    "model-too-large/hit-params-fill-device.memdoc": lambda p: model_state_run(
        p, param_bytes=13.5 * GiB, fail_before_step=True
    ),
    "model-too-large/miss-small-model.memdoc": lambda p: model_state_run(
        p, param_bytes=2 * GiB, fail_before_step=False
    ),
    "optimizer-state/hit-first-step-adam.memdoc": lambda p: optimizer_first_step(
        p, state_ratio=2.0
    ),
    "optimizer-state/miss-sgd.memdoc": lambda p: optimizer_first_step(p, state_ratio=0.0),
    "no-mixed-precision/hit-fp32-params.memdoc": lambda p: dtype_run(p, dtype="float32"),
    "no-mixed-precision/miss-bf16-params.memdoc": lambda p: dtype_run(p, dtype="bfloat16"),
    "variable-shapes/hit-varying-lengths.memdoc": lambda p: shapes_run(p, varying=True),
    "variable-shapes/miss-fixed-shapes.memdoc": lambda p: shapes_run(p, varying=False),
    "checkpoint-load-spike/hit-load-mark-spike.memdoc": lambda p: load_spike(p, spike=True),
    "checkpoint-load-spike/miss-load-no-spike.memdoc": lambda p: load_spike(p, spike=False),
    "host-oom/hit-sigkill-near-limit.memdoc": lambda p: host_killed(p, near_limit=True),
    "host-oom/hit-cgroup-oom-kill.memdoc": cgroup_oom_kill,
    "host-oom/miss-exit-1.memdoc": lambda p: host_killed(p, near_limit=False),
    "host-oom/miss-sigkill-no-oom-kill-counted.memdoc": lambda p: killed_far_below_the_limit(
        p, kills_counted=True
    ),
    "host-oom/hit-sigkill-counter-unread.memdoc": lambda p: killed_far_below_the_limit(
        p, kills_counted=False
    ),
    "cuda-graph-pools/hit-private-pool.memdoc": private_pool_recorded,
    "nccl-buffers/hit-outside-pool-growth.memdoc": nccl_outside_pool,
    "rank-failed-first/hit-rank1-first/rank0.memdoc": lambda p: rank_trace(
        p, rank=0, peak=10 * GiB, fail_at=30.0
    ),
    "rank-failed-first/hit-rank1-first/rank1.memdoc": lambda p: rank_trace(
        p, rank=1, peak=10 * GiB, fail_at=6.0
    ),
    "rank-failed-first/miss-all-finished/rank0.memdoc": lambda p: rank_trace(
        p, rank=0, peak=10 * GiB, fail_at=None
    ),
    "rank-failed-first/miss-all-finished/rank1.memdoc": lambda p: rank_trace(
        p, rank=1, peak=10 * GiB, fail_at=None
    ),
    "rank-memory-skew/hit-rank0-heavy/rank0.memdoc": lambda p: rank_trace(
        p, rank=0, peak=20 * GiB, fail_at=6.0
    ),
    "rank-memory-skew/hit-rank0-heavy/rank1.memdoc": lambda p: rank_trace(
        p, rank=1, peak=10 * GiB, fail_at=None
    ),
    "rank-memory-skew/miss-balanced/rank0.memdoc": lambda p: rank_trace(
        p, rank=0, peak=10 * GiB, fail_at=None
    ),
    "rank-memory-skew/miss-balanced/rank1.memdoc": lambda p: rank_trace(
        p, rank=1, peak=10.5 * GiB, fail_at=None
    ),
    **HOST_SCENARIOS,
}


def build_all(root: Path) -> list[Path]:
    """Write every scenario under `root`; returns the paths written."""
    written = []
    for relative, build in SCENARIOS.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        build(path)
        written.append(path)
    return written
