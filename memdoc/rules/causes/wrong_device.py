"""MD004 wrong-device: work lands on one GPU while the intended one stays idle."""

from __future__ import annotations

from memdoc.rules.base import Finding, Fix
from memdoc.rules.facts import (
    device_peak_used,
    failed_device,
    failure,
    framework_devices,
    frameworks,
)
from memdoc.rules.spec import LIKELY, POSSIBLE, RuleSpec, bytes_evidence, count_evidence, snippet
from memdoc.trace.model import OomInfo
from memdoc.trace.reader import Trace
from memdoc.units import format_bytes

BUSY_SHARE = 0.85
IDLE_SHARE = 0.10


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
- `memdoc run` records memory per device and per process.
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

    def check(self, trace: Trace) -> Finding | None:
        fail = failure(trace)
        oom = fail.oom if fail is not None else None
        if trace.is_text_only:
            return self._rank_on_gpu0(trace, oom) if oom is not None else None
        misplaced = self._away_from_local_rank(trace)
        if misplaced is not None or oom is None:
            return misplaced
        failed = failed_device(trace, oom)
        return self._idle_neighbour(trace, failed) if failed is not None else None

    def _rank_on_gpu0(self, trace: Trace, oom: OomInfo) -> Finding | None:
        """A rank above 0 failing on GPU 0: the classic missing `set_device`."""
        if oom.rank is None or oom.rank <= 0 or oom.device != 0:
            return None
        summary = f"Rank {oom.rank} ran out of memory on GPU 0, not on a GPU of its own."
        evidence = [
            count_evidence("failing rank", oom.rank),
            count_evidence("device it used", 0),
        ]
        return self.finding(
            trace,
            POSSIBLE,
            summary,
            evidence,
            to_confirm=(
                "check whether each rank sees only its own GPU (CUDA_VISIBLE_DEVICES); "
                "if not, run under `memdoc run` to see where each rank allocates"
            ),
            frameworks=frameworks(trace, oom),
        )

    def _away_from_local_rank(self, trace: Trace) -> Finding | None:
        """The framework allocated on devices other than the one LOCAL_RANK names."""
        expected = _expected_device(trace)
        used = set().union(*framework_devices(trace).values())
        if expected is None or not used or expected in used or _one_visible_gpu(trace):
            return None
        summary = (
            f"Rank with LOCAL_RANK={expected} allocated on GPU "
            f"{', '.join(map(str, sorted(used)))} instead of GPU {expected}."
        )
        evidence = [
            count_evidence("expected device (LOCAL_RANK)", expected),
            count_evidence("devices it used", len(used)),
        ]
        return self.finding(trace, LIKELY + 0.1, summary, evidence, frameworks=frameworks(trace))

    def _idle_neighbour(self, trace: Trace, failed: int) -> Finding | None:
        total = trace.device_total_bytes(failed)
        busy = device_peak_used(trace, failed)
        if not total or busy is None or busy < BUSY_SHARE * total:
            return None
        for device in trace.devices():
            other_total = trace.device_total_bytes(device.index)
            used = device_peak_used(trace, device.index)
            if device.index == failed or not other_total or used is None:
                continue
            if used <= IDLE_SHARE * other_total:
                summary = (
                    f"GPU {failed} ran out while GPU {device.index} stayed idle "
                    f"({format_bytes(used)} used of {format_bytes(other_total)})."
                )
                evidence = [
                    bytes_evidence(f"peak used on GPU {failed}", busy),
                    bytes_evidence(f"peak used on GPU {device.index}", used),
                ]
                return self.finding(
                    trace,
                    POSSIBLE - 0.05,
                    summary,
                    evidence,
                    to_confirm="check which device the script selects (`cuda:0` hard-coded?)",
                    frameworks=frameworks(trace),
                )
        return None


def _one_visible_gpu(trace: Trace) -> bool:
    """Each rank sees only its own GPU, which it then calls device 0."""
    visible = trace.header.env.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and "," not in visible


def _expected_device(trace: Trace) -> int | None:
    value = trace.header.env.get("LOCAL_RANK")
    if value is None or not value.isdigit():
        return None
    return int(value)


RULE = WrongDevice()
