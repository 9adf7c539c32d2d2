"""MD004 wrong-device: work lands on one GPU while the intended one stays idle."""

from __future__ import annotations

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, Signals
from memdoc.rules.context import Facts
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    snippet,
)
from memdoc.trace.model import Metric, OomInfo
from memdoc.units import GiB, format_bytes

BUSY_SHARE = 0.85
IDLE_SHARE = 0.10
# More than a CUDA context (0.3 to 1.5 GiB): a process that works on the device.
WORKING_MIN_BYTES = 2 * GiB
WORKING_SHARE = 0.1


class WrongDevice(RuleSpec):
    slug = "wrong-device"
    code = "MD004"
    title = "Work lands on the wrong GPU"
    what = """
The job fills one GPU while another GPU it was meant to use stays nearly empty. Typical
cases: every rank of a multi-GPU job allocating on GPU 0, or a script that hard-codes
`cuda:0` on a machine where another GPU was free.
"""
    why = """
`"cuda"` without an index means the current device, which is GPU 0 until
`torch.cuda.set_device` changes it. Launchers such as `torchrun` set `LOCAL_RANK` but do not
select the device for you. Tensors and modules created before the device is chosen, and
checkpoints saved on GPU 0 and loaded without `map_location`, end up on GPU 0.
"""
    confirm = """
- `nvidia-smi` shows one GPU full and another idle while the job runs.
- A rank other than 0 fails on GPU 0 (`[rank3]: ... GPU 0 has a total capacity ...`).
  Unless each rank sees only its own GPU through `CUDA_VISIBLE_DEVICES`, rank 3 belongs on
  GPU 3.
- `memdoc run` records memory per device and per process: several processes of the job
  each working on GPU 0 means the ranks never chose their own device.
"""
    fixes = (
        Fix(
            "pytorch",
            "Use an explicit device index per rank",
            snippet(
                """
            import os, torch

            local_rank = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(local_rank)
            model = model.to(f"cuda:{local_rank}")
            """
            ),
            gpu_only=True,
        ),
        Fix(
            "tensorflow",
            "Place the work on the GPU you mean",
            snippet(
                """
            import tensorflow as tf

            with tf.device("/GPU:1"):
                outputs = model(inputs)
            """
            ),
        ),
        Fix(
            "jax",
            "Put arrays on the device you mean",
            snippet(
                """
            import jax

            x = jax.device_put(x, jax.devices()[1])
            """
            ),
        ),
        Fix(
            "any",
            "Show the process only the GPU it should use",
            "CUDA_VISIBLE_DEVICES=1 python train.py",
            "bash",
            gpu_only=True,
        ),
    )
    references = (
        ("PyTorch: CUDA semantics", "https://pytorch.org/docs/stable/notes/cuda.html"),
        (
            "TensorFlow: use a GPU (manual placement)",
            "https://www.tensorflow.org/guide/gpu#manual_device_placement",
        ),
        (
            "JAX: jax.device_put",
            "https://jax.readthedocs.io/en/latest/_autosummary/jax.device_put.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        oom = fail.oom if fail is not None else None
        if facts.is_text_only:
            return self._rank_on_gpu0(facts, oom) if oom is not None else None
        found = self._away_from_local_rank(facts) or self._crowded(facts, oom)
        if found is not None or oom is None:
            return found
        failed = facts.failed_device(oom)
        return self._idle_neighbour(facts, failed) if failed is not None else None

    def _crowded(self, facts: Facts, oom: OomInfo | None) -> Finding | None:
        """Several of this job's processes each work on one GPU: ranks that never chose a
        device of their own. Other GPUs left idle, or the failure there, say it was not meant."""
        failed = facts.failed_device(oom)
        for device in facts.trace.devices():
            total = facts.trace.device_total_bytes(device.index) if device.index >= 0 else None
            if not total:
                continue
            working = _working_processes(facts, oom, device.index, total)
            idle = _idle_devices(facts, device.index)
            failed_here = oom is not None and failed == device.index
            if len(working) < 2 or not (failed_here or idle):
                continue
            return self._report_crowded(facts, device.index, working, idle, failed_here)
        return None

    def _report_crowded(
        self,
        facts: Facts,
        device: int,
        working: dict[int, float],
        idle: list[int],
        failed_here: bool,
    ) -> Finding:
        pids = ", ".join(str(pid) for pid in sorted(working))
        summary = (
            f"{len(working)} processes of this job (PIDs {pids}) each worked on GPU {device}, "
            f"{format_bytes(min(working.values()))} to {format_bytes(max(working.values()))} "
            "each"
        )
        if idle:
            summary += f", while GPU {', '.join(map(str, idle))} stayed idle"
        summary += ": ranks that did not select a device of their own."
        evidence = [
            count_evidence(f"processes of this job working on GPU {device}", len(working)),
            bytes_evidence("held by them together", sum(working.values())),
            count_evidence("other GPUs left idle", len(idle)),
        ]
        return self.finding(
            facts,
            Signals.of(
                LIKELY,
                failed_there=failed_here,
                other_gpus_idle=bool(idle),
                three_or_more=len(working) >= 3,
            ),
            summary,
            evidence,
            to_confirm=(
                "check that each rank calls torch.cuda.set_device(LOCAL_RANK) before any CUDA "
                "call, or sees only its own GPU through CUDA_VISIBLE_DEVICES"
            ),
            frameworks=facts.frameworks(None),
        )

    def _rank_on_gpu0(self, facts: Facts, oom: OomInfo) -> Finding | None:
        """A rank above 0 failing on GPU 0: the classic missing `set_device`."""
        if oom.rank is None or oom.rank <= 0 or oom.device != 0:
            return None
        summary = f"Rank {oom.rank} ran out of memory on GPU 0, not on a GPU of its own."
        evidence = [
            count_evidence("failing rank", oom.rank),
            count_evidence("device it used", 0),
        ]
        return self.finding(
            facts,
            Signals(POSSIBLE),
            summary,
            evidence,
            to_confirm=(
                "check whether each rank sees only its own GPU (CUDA_VISIBLE_DEVICES); "
                "if not, run under `memdoc run` to see where each rank allocates"
            ),
            frameworks=facts.frameworks(oom),
        )

    def _away_from_local_rank(self, facts: Facts) -> Finding | None:
        """The framework allocated on devices other than the one LOCAL_RANK names."""
        expected = _expected_device(facts)
        used = set().union(*facts.framework_devices().values())
        if expected is None or not used or expected in used or _one_visible_gpu(facts):
            return None
        summary = (
            f"Rank with LOCAL_RANK={expected} allocated on GPU "
            f"{', '.join(map(str, sorted(used)))} instead of GPU {expected}."
        )
        evidence = [
            count_evidence("expected device (LOCAL_RANK)", expected),
            count_evidence("devices it used", len(used)),
        ]
        return self.finding(
            facts, Signals(STRONG), summary, evidence, frameworks=facts.frameworks()
        )

    def _idle_neighbour(self, facts: Facts, failed: int) -> Finding | None:
        total = facts.trace.device_total_bytes(failed)
        busy = facts.device_peak_used(failed)
        if not total or busy is None or busy < BUSY_SHARE * total:
            return None
        idle = _idle_devices(facts, failed)
        if not idle:
            return None
        other = idle[0]
        other_total = facts.trace.device_total_bytes(other) or 0
        used = facts.device_peak_used(other) or 0.0
        summary = (
            f"GPU {failed} ran out while GPU {other} stayed idle "
            f"({format_bytes(used)} used of {format_bytes(other_total)})."
        )
        evidence = [
            bytes_evidence(f"peak used on GPU {failed}", busy),
            bytes_evidence(f"peak used on GPU {other}", used),
        ]
        return self.finding(
            facts,
            Signals(POSSIBLE),
            summary,
            evidence,
            to_confirm="check which device the script selects (`cuda:0` hard-coded?)",
            frameworks=facts.frameworks(),
        )


def _working_processes(
    facts: Facts, oom: OomInfo | None, device: int, total: float
) -> dict[int, float]:
    """{pid: bytes} of this job's processes that hold more than a context on the device,
    from NVML's per-process figures and from the processes the error text names."""
    ours = facts.trace.our_pids()
    held: dict[int, float] = {}
    for series in facts.trace.series_for(Metric.GPU_PROC_USED, device=device):
        top = series.max()
        if series.key.pid in ours and top is not None:
            held[series.key.pid] = top[1]
    if oom is not None and oom.device == device:
        for process in oom.processes:
            if process.pid in ours and process.used_bytes:
                held[process.pid] = max(held.get(process.pid, 0.0), float(process.used_bytes))
    floor = max(WORKING_MIN_BYTES, WORKING_SHARE * total)
    return {pid: used for pid, used in held.items() if used >= floor}


def _idle_devices(facts: Facts, busy: int) -> list[int]:
    """Other GPUs of the machine that the job left (nearly) empty."""
    idle = []
    for device in facts.trace.devices():
        total = facts.trace.device_total_bytes(device.index) if device.index >= 0 else None
        used = facts.device_peak_used(device.index) if total else None
        if device.index != busy and total and used is not None and used <= IDLE_SHARE * total:
            idle.append(device.index)
    return idle


def _one_visible_gpu(facts: Facts) -> bool:
    """Each rank sees only its own GPU, which it then calls device 0."""
    visible = facts.trace.header.env.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and "," not in visible


def _expected_device(facts: Facts) -> int | None:
    value = facts.trace.header.env.get("LOCAL_RANK")
    if value is None or not value.isdigit():
        return None
    return int(value)


RULE = WrongDevice()
