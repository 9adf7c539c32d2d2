"""MD007 memory-fraction-cap: a configured cap, not the card, is the limit."""

from __future__ import annotations

from memdoc.kinds import OomKind
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    framework_name,
)
from memdoc.rules.host import (
    cpu_allocator_said,
)
from memdoc.rules.ledger import pool_bytes, room_was_left
from memdoc.rules.serving import MORE_OF_THE_DEVICE_FIX, kv_cache_finding, kv_cache_short
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.model import EventKind, Metric
from memdoc.units import format_bytes, format_percent

# A limit this far below the device size was set by someone.
CAP_SHARE = 0.97
# Held plus requested this close to the limit reached it: the message rounds both.
ROUNDED = 0.995


class MemoryFractionCap(RuleSpec):
    slug = "memory-fraction-cap"
    code = "MD007"
    title = "A configured memory cap, not the card, is the limit"
    host_title = "A configured memory cap, not the machine, is the limit"
    what = """
The allocator refused the request because of a limit set in configuration, while the GPU
itself still had room: `torch.cuda.set_per_process_memory_fraction`, JAX's
`XLA_PYTHON_CLIENT_MEM_FRACTION`, or a TensorFlow logical device with `memory_limit`. On
Apple silicon, PyTorch's MPS backend stops at a high-watermark share of the Mac's memory
("max allowed" in its message), set by `PYTORCH_MPS_HIGH_WATERMARK_RATIO`. vLLM uses only
`gpu_memory_utilization` of the device (0.9 unless set) and refuses to start when what that
share leaves after the weights cannot hold the KV cache of one full-length sequence.
TensorFlow's CPU allocator can be given a limit of its own too (`TF_CPU_ALLOCATOR_USE_BFC`
with `TF_CPU_BFC_MEM_LIMIT_IN_MB`): it then refuses tensors at that limit while the
machine's RAM has room.
"""
    why = """
Caps are set to share a GPU between processes, or copied from an example, and then
forgotten. PyTorch reports the cap as "X allowed" in its message. JAX's default cap is 75%
of the device, so a JAX program can run out with a quarter of the GPU untouched.
"""
    confirm = """
- The PyTorch message contains "X allowed", and reserved plus the request exceeds it.
- `XLA_PYTHON_CLIENT_MEM_FRACTION` or `memory_limit` appears in the environment or code.
- The device had more free memory than the request (`nvidia-smi`, or the message's "free").
- On the CPU, TensorFlow's message names its allocator (`bfc_cpu_allocator_for_gpu`), and
  `TF_CPU_BFC_MEM_LIMIT_IN_MB` is set far below the machine's memory.
"""
    fixes = (
        Fix(
            "pytorch",
            "Raise or remove the per-process fraction",
            snippet(
                """
            import torch

            torch.cuda.set_per_process_memory_fraction(1.0, device=0)
            """
            ),
            gpu_only=True,
        ),
        Fix(
            "jax",
            "Let JAX use more of the device",
            "export XLA_PYTHON_CLIENT_MEM_FRACTION=.90",
            "bash",
        ),
        Fix(
            "tensorflow",
            "Raise the logical device's memory limit (in MB)",
            snippet(
                """
            import tensorflow as tf

            gpu = tf.config.list_physical_devices("GPU")[0]
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=20000)]
            )
            """
            ),
        ),
    )
    references = (
        (
            "PyTorch: set_per_process_memory_fraction",
            "https://pytorch.org/docs/stable/generated/torch.cuda.set_per_process_memory_fraction.html",
        ),
        (
            "JAX: GPU memory allocation",
            "https://jax.readthedocs.io/en/latest/gpu_memory_allocation.html",
        ),
        (
            "TensorFlow: tf.config.set_logical_device_configuration",
            "https://www.tensorflow.org/api_docs/python/tf/config/set_logical_device_configuration",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return None
        oom = fail.oom
        device = facts.failed_device(oom)
        total = facts.device_total(device, oom)
        if oom.allocator == "mps" and oom.limit_bytes is not None and not total:
            return self._mps_watermark(facts, fail)
        if kv_cache_short(fail):
            return self._vllm_share(facts, fail)
        if facts.on_host(oom):
            return self._host_allocator_cap(facts, fail)
        limit = _limit(facts, fail, device)
        if limit is None and facts.is_text_only and room_was_left(oom):
            return self._refused_with_room(facts, fail)
        if (
            limit is not None
            and not total
            and oom.framework == "pytorch"
            and oom.kind == OomKind.ALLOCATOR
        ):
            return self._cap_without_device(facts, fail, limit)
        if limit is None or not total or limit >= CAP_SHARE * total:
            return None
        held = _held(facts, fail, device)
        requested = oom.requested_bytes
        if _short_of_cap(held, requested, limit):
            return None  # the cap was not what stopped this request
        free = oom.free_bytes if oom.free_bytes is not None else _free(facts, fail, device)
        room = free is not None and requested is not None and free >= requested
        evidence: list[Evidence] = [
            bytes_evidence("configured limit", limit),
            share_evidence("limit / device", limit / total),
        ]
        if held is not None:
            evidence.append(bytes_evidence("held by the allocator", held))
        if free is not None:
            evidence.append(bytes_evidence("free on the device", free))
        if room:
            signals = Signals(STRONG)
            summary = (
                f"The allocator stopped at a configured {format_bytes(limit)} "
                f"({limit / total:.0%} of the device) while {format_bytes(free)} were still free."
            )
        else:
            signals = Signals(LIKELY if free is None else POSSIBLE)
            summary = (
                f"A configured limit of {format_bytes(limit)} ({limit / total:.0%} of the "
                "device) was reached."
            )
        return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks(oom))

    def _host_allocator_cap(self, facts: Facts, fail: Failure) -> Finding | None:
        """A framework's own allocator on the host (TensorFlow's CPU BFC allocator) stopped at
        the limit it was configured with, far below the machine's memory."""
        oom = fail.oom
        limit = facts.host_allocator_limit(oom, fail.stats)
        ram = facts.machine_memory()
        if limit is None or ram is None or limit >= CAP_SHARE * ram:
            return None
        held = _cpu_allocator_held(fail)
        requested = oom.requested_bytes
        # A graph's error is read after it released its tensors: what was held when the
        # request failed is at most the allocator's peak, and only if even that and the
        # request stay under the cap was the cap not what refused it.
        peak = cpu_allocator_said(fail.stats, "peak_bytes")
        reached = peak if peak is not None and (held is None or peak > held) else held
        if _short_of_cap(reached, requested, limit):
            return None  # the cap was not what stopped this request
        if _no_room_beyond(facts, fail, requested):
            return None  # a higher limit had nowhere to go: the process's own cap was full
        available = facts.sum_at(Metric.HOST_AVAILABLE, None, fail.t)
        room = available is not None and requested is not None and available >= requested
        evidence: list[Evidence] = [
            bytes_evidence("allocator limit", limit),
            share_evidence("limit / machine memory", limit / ram),
        ]
        if held is not None:
            evidence.append(bytes_evidence("held by the allocator", held))
        if reached is not None and reached != held:
            evidence.append(bytes_evidence("the most the allocator held", reached))
        if available is not None:
            evidence.append(bytes_evidence("available on the host", available))
        name = framework_name(oom.framework)
        summary = (
            f"{name}'s CPU allocator stopped at the {format_bytes(limit)} it was configured "
            f"with ({format_percent(limit / ram)} of the machine's {format_bytes(ram)})"
            + (f", while the host had {format_bytes(available)} available." if room else ".")
        )
        return self.finding(
            facts,
            Signals(STRONG if room else LIKELY),
            summary,
            evidence,
            frameworks=facts.frameworks(oom),
            fixes=(TF_CPU_CAP_FIX,) if oom.framework == "tensorflow" else self.fixes,
        )

    def _cap_without_device(self, facts: Facts, fail: Failure, limit: float) -> Finding:
        """PyTorch prints "X allowed" only when a memory fraction is set: a cap there was,
        though the text does not say how it compares with the device."""
        summary = (
            f"A memory fraction was set on this process: PyTorch allowed it "
            f"{format_bytes(limit)}, and that, not necessarily the device, is what ran out."
        )
        return self.finding(
            facts,
            Signals(POSSIBLE),
            summary,
            [bytes_evidence("configured limit", limit)],
            to_confirm="compare the limit with the device's size (nvidia-smi)",
            frameworks=["pytorch"],
        )

    def _refused_with_room(self, facts: Facts, fail: Failure) -> Finding:
        """The device had plenty free, yet the allocator refused: a cap it was given is the
        likeliest limit, though the message names none."""
        oom = fail.oom
        free, requested = float(oom.free_bytes or 0), float(oom.requested_bytes or 0)
        evidence: list[Evidence] = [
            bytes_evidence("requested", requested),
            bytes_evidence("free on the device", free),
            ratio_evidence("free / request", free / requested),
        ]
        summary = (
            f"The device had {format_bytes(free)} free, far more than the "
            f"{format_bytes(requested)} asked for, yet the allocator refused: a limit set on "
            "this process (a memory fraction, a tool's memory share) is the likeliest reason."
        )
        return self.finding(
            facts,
            Signals(POSSIBLE),
            summary,
            evidence,
            to_confirm="look for set_per_process_memory_fraction or a memory share in the "
            "program's settings; on Windows and WSL, the driver's own accounting can refuse too",
            frameworks=facts.frameworks(oom),
            fixes=(*self.fixes, DRIVER_SPLIT_FIX),
        )

    def _mps_watermark(self, facts: Facts, fail: Failure) -> Finding:
        """Apple's MPS stops at a high-watermark ratio of the machine's memory, a setting."""
        oom = fail.oom
        limit = float(oom.limit_bytes or 0)
        evidence: list[Evidence] = [bytes_evidence("MPS upper limit (max allowed)", limit)]
        if oom.allocated_bytes is not None:
            evidence.append(bytes_evidence("allocated by MPS", oom.allocated_bytes))
        summary = (
            f"MPS refused memory at its upper limit of {format_bytes(limit)}, which "
            "PYTORCH_MPS_HIGH_WATERMARK_RATIO sets as a share of the Mac's memory, not at what "
            "the machine has."
        )
        return self.finding(
            facts,
            Signals(WEAK),
            summary,
            evidence,
            to_confirm="watch Activity Monitor's memory pressure: with room left, the limit "
            "is what stops the run; with none, raising it only moves the failure into swap",
            frameworks=["pytorch"],
            fixes=(MPS_WATERMARK_FIX,),
        )

    def _vllm_share(self, facts: Facts, fail: Failure) -> Finding:
        """vLLM takes only gpu_memory_utilization of the device: a setting, not the card."""
        summary = (
            "vLLM uses only the share of the device that gpu_memory_utilization gives it (0.9 "
            "unless set); the KV cache gets what is left of that share after the weights."
        )
        return kv_cache_finding(
            self,
            facts,
            fail,
            Signals(POSSIBLE),
            summary,
            to_confirm="run nvidia-smi before starting vLLM: what other processes hold is "
            "not available to it, whatever the setting",
            fix=MORE_OF_THE_DEVICE_FIX,
        )


# Where no cap was set, the free memory was split in a way the allocator could not map
# (Windows and WSL drivers): segments that grow are mapped in smaller pieces.
DRIVER_SPLIT_FIX = Fix(
    "pytorch",
    "With no cap set: let PyTorch map memory in smaller pieces (PyTorch 2.1 and later)",
    "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "bash",
    gpu_only=True,
)
TF_CPU_CAP_FIX = Fix(
    "tensorflow",
    "Raise TensorFlow's CPU allocator limit, or give the CPU back its default allocator",
    snippet(
        """
    export TF_CPU_BFC_MEM_LIMIT_IN_MB=16384   # in MiB; what the host can spare
    # or: unset TF_CPU_ALLOCATOR_USE_BFC       # the default CPU allocator has no limit of its own
    """
    ),
    "bash",
)
MPS_WATERMARK_FIX = Fix(
    "pytorch",
    "Raise MPS's upper limit (Apple silicon; 0.0 removes it, and swapping may follow)",
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 python train.py",
    language="bash",
)


def _limit(facts: Facts, fail: Failure, device: int | None) -> float | None:
    if fail.oom.limit_bytes is not None:
        return fail.oom.limit_bytes
    if facts.is_text_only or device is None:
        return None
    recorded = facts.framework_at(Metric.LIMIT, device, fail.t)
    if recorded is not None:
        return recorded
    total = facts.trace.device_total_bytes(device)
    for event in facts.trace.events(EventKind.ALLOCATOR_CONFIG):
        if event.data.get("memory_limit_bytes"):
            return float(event.data["memory_limit_bytes"])
        fraction = event.data.get("memory_fraction") or event.data.get("mem_fraction")
        if isinstance(fraction, (int, float)) and total:
            return float(fraction) * total
    fraction_env = facts.trace.header.env.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if fraction_env and total:
        try:
            return float(fraction_env) * total
        except ValueError:
            return None
    return None


def _short_of_cap(held: float | None, requested: int | None, limit: float) -> bool:
    """What was held and the request together stayed under the cap: the cap was not what
    refused it. The message rounds its figures (to 0.01 of a unit): within that, the cap
    was reached. False where either is unknown."""
    return held is not None and requested is not None and held + requested < limit * ROUNDED


def _no_room_beyond(facts: Facts, fail: Failure, requested: int | None) -> bool:
    """The failing process's own address-space cap left it less room than the request at
    the error: raising its allocator's limit could not have made the request fit."""
    room = facts.address_space_room(fail)
    return room is not None and bool(requested) and room[2] < (requested or 0)


def _cpu_allocator_held(fail: Failure) -> float | None:
    """What the framework's CPU allocator held at the error: its dump's "in use", or what
    the framework said of it then."""
    if fail.oom.bfc_in_use_bytes is not None:
        return float(fail.oom.bfc_in_use_bytes)
    return cpu_allocator_said(fail.stats, "allocated_bytes")


def _held(facts: Facts, fail: Failure, device: int | None) -> float | None:
    pool = pool_bytes(fail.oom)
    if pool is not None:
        return pool
    if facts.is_text_only or device is None:
        return None
    return facts.framework_at(Metric.RESERVED, device, fail.t)


def _free(facts: Facts, fail: Failure, device: int | None) -> float | None:
    if facts.is_text_only or device is None:
        return None
    return facts.sum_at(Metric.GPU_FREE, device, fail.t)


RULE = MemoryFractionCap()
