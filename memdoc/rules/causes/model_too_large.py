"""MD013 model-too-large: the weights (plus gradients) alone do not fit."""

from __future__ import annotations

from memdoc.oom.names import fills_random_values
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    said,
)
from memdoc.rules.serving import (
    SMALLER_WEIGHTS_FIX,
    kv_cache_empty,
    kv_cache_finding,
    kv_cache_short,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    share_evidence,
    snippet,
)
from memdoc.thresholds import MODEL_FILLS_SHARE, little_free
from memdoc.trace.model import EventKind
from memdoc.units import format_bytes

WEIGHTS_FILL = 0.8
# The device nearly full while the framework held under SMALL_SHARE of it: the weights being
# placed did not fill it.
SMALL_SHARE = 0.25


FREEZE_FIX = Fix(
    "pytorch",
    "Fine-tune the last layers only (or adapters): frozen weights take no gradients",
    snippet(
        """
    for param in model.parameters():
        param.requires_grad_(False)
    for param in model.classifier.parameters():  # the head; or LoRA adapters (peft)
        param.requires_grad_(True)
    optimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
    """
    ),
)


class ModelTooLarge(RuleSpec):
    slug = "model-too-large"
    code = "MD013"
    title = "The weights alone do not fit"
    what = """
The model's parameters (and for training its gradients) take nearly the whole device, or
more, before any batch is processed. The job fails while moving or loading the model, or in
the very first step.
"""
    why = """
A parameter takes 4 bytes in fp32, 2 in bf16/fp16; training adds a gradient of the same
size and, for Adam, two more fp32 states. A 7-billion-parameter model is 28 GB of weights in
fp32 alone. Loading a checkpoint in its stored precision, or without sharding, puts all of
it on one device.
"""
    confirm = """
- The error happens in `.to("cuda")`, `.cuda()`, `from_pretrained` or while loading
  checkpoint shards, or in a module's constructor while the model is built directly on the
  device (`with torch.device("cuda"):`), before any batch.
- Parameter count times bytes per parameter is close to the device size
  (`sum(p.numel() * p.element_size() for p in model.parameters())`).
- `memdoc run` records parameter and gradient bytes per device.
"""
    fixes = (
        Fix(
            "pytorch",
            "Load in bf16, and let Accelerate place the layers",
            snippet(
                """
            import torch
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                name, torch_dtype=torch.bfloat16, device_map="auto"
            )
            """
            ),
        ),
        FREEZE_FIX,
        Fix(
            "pytorch",
            "Quantize the weights",
            snippet(
                """
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            model = AutoModelForCausalLM.from_pretrained(
                name, quantization_config=BitsAndBytesConfig(load_in_4bit=True), device_map="auto"
            )
            """
            ),
            gpu_only=True,
        ),
        Fix(
            "pytorch",
            "Shard parameters, gradients and optimizer state across GPUs",
            snippet(
                """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            model = FSDP(model)
            """
            ),
            gpu_only=True,
        ),
        Fix(
            "jax",
            "Shard the parameters over devices",
            snippet(
                """
            import jax
            from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

            mesh = Mesh(jax.devices(), ("model",))
            params = jax.device_put(params, NamedSharding(mesh, P("model")))
            """
            ),
        ),
    )
    references = (
        (
            "Accelerate: big model inference",
            "https://huggingface.co/docs/accelerate/usage_guides/big_modeling",
        ),
        ("PyTorch: FSDP", "https://pytorch.org/docs/stable/fsdp.html"),
        (
            "JAX: distributed arrays and automatic parallelization",
            "https://jax.readthedocs.io/en/latest/notebooks/Distributed_arrays_and_automatic_parallelization.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if not facts.is_text_only:
            found = self._from_model_state(facts, fail)
            if found is None and fail is not None:
                found = self._from_model_in_hand(facts, fail)
            if found is not None:
                return found
        if fail is not None and kv_cache_short(fail):
            return self._weights_leave_no_cache(facts, fail)
        return self._while_placing(facts, fail) if fail is not None else None

    def _weights_leave_no_cache(self, facts: Facts, fail: Failure) -> Finding:
        """The weights take most of what vLLM may use, leaving too little for its cache."""
        summary = (
            "The model's weights may take most of what vLLM may use, leaving too little for "
            "its KV cache: a quantized model, or the model split over more GPUs, leaves more."
        )
        return kv_cache_finding(
            self,
            facts,
            fail,
            Signals(POSSIBLE if kv_cache_empty(fail) else WEAK),
            summary,
            to_confirm="vLLM logs how much the weights took at start ('Loading model weights "
            "took N GiB')",
            fix=SMALLER_WEIGHTS_FIX,
        )

    def _from_model_state(self, facts: Facts, fail: Failure | None) -> Finding | None:
        for event in facts.trace.events(EventKind.MODEL_STATE):
            device = event.data.get("device")
            total = facts.trace.device_total_bytes(device) if isinstance(device, int) else None
            params = float(event.data.get("param_bytes") or 0)
            grads = float(event.data.get("grad_bytes") or 0)
            if not total or not params:
                continue
            share = (params + grads) / total
            if share < WEIGHTS_FILL and not (
                fail is not None and share >= 0.5 and not facts.trace.steps()
            ):
                continue
            evidence: list[Evidence] = [
                bytes_evidence("parameters", params),
                bytes_evidence("gradients", grads),
                share_evidence("parameters and gradients / device", share),
            ]
            signals = Signals.of(
                STRONG if params >= 0.95 * total else LIKELY,
                nearly_full=share >= 0.95,
                failed_before_steps=fail is not None and not facts.trace.steps(),
            )
            summary = (
                f"Parameters and gradients take {format_bytes(params + grads)}, "
                f"{share:.0%} of GPU {device}, before any batch."
            )
            return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks())
        return None

    def _from_model_in_hand(self, facts: Facts, fail: Failure) -> Finding | None:
        """The first step ran out with the model's weights and gradients most of what the
        program held: no batch is small enough."""
        weights = facts.model_weights(fail)
        if weights is None or weights.share < MODEL_FILLS_SHARE:
            return None
        if facts.stepped_before(fail.t):
            return None  # a step trained with these weights: what changed since is the cause
        grads = weights.trainable_bytes
        held = format_bytes(weights.held.held_bytes)
        summary = (
            f"{weights.name}'s weights ({format_bytes(weights.param_bytes)}) and the gradients "
            f"they take ({format_bytes(grads)}) come to "
        )
        if weights.share >= 1:
            summary += (
                f"{format_bytes(weights.with_gradients)}, more than the {held} the program "
                "held when its first step ran out making them"
            )
        else:
            summary += (
                f"{weights.share:.0%} of the {held} the program held when its first step ran out"
            )
        summary += ": a smaller batch leaves them where they are."
        evidence: list[Evidence] = [
            Evidence(f"model in hand: {weights.name}"),
            bytes_evidence("parameters", weights.param_bytes),
            bytes_evidence("gradients they take", grads),
            bytes_evidence(weights.held.label, weights.held.held_bytes),
            share_evidence("parameters and gradients / held", weights.share),
        ]
        signals = Signals.of(
            LIKELY,
            failed_before_steps=True,
            in_training_pass=fail.stack_cues.phase is not None,
            weights_fill_what_was_held=weights.share >= 0.9,
        )
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm="train only the last layers (requires_grad_(False) on the rest): "
            "the gradients go, and the first step should fit",
            frameworks=facts.frameworks(fail.oom),
            fixes=(FREEZE_FIX, *(fix for fix in self.fixes if fix is not FREEZE_FIX)),
        )

    def _while_placing(self, facts: Facts, fail: Failure) -> Finding | None:
        """The error came from moving, loading or building the model's parameters."""
        if fail.oom.framework == "host":
            return None  # a host kill while loading: host-oom
        if fail.oom.phase == "init":
            return None  # no context could be created: nothing of the model was placed yet
        moving = fail.stack_cues.moving_weights or said(fail).moving_weights
        building = _building(fail) or _initializing_outside_a_loop(facts, fail)
        constructing = not building and _in_a_constructor(fail)
        if not (moving or building or constructing) and fail.oom.phase != "load":
            return None
        if fail.stack_cues.torch_load and not moving:
            return None  # torch.load itself: checkpoint-load-spike
        before_steps = not facts.is_text_only and not facts.stepped_before(fail.t)
        evidence, full, held = _fill_evidence(facts, fail)
        if constructing and not moving:
            summary = (
                "The error came from inside a constructor, where a library builds its model on "
                "the device"
            )
        elif building and not moving:
            summary = "The error happened while building the model's parameters"
        else:
            summary = "The error happened while loading the model or moving it to the device"
        summary += ", before any step" if before_steps else ""
        summary += f", with {format_bytes(held)} already there." if full and held else "."
        signals = Signals.of(
            LIKELY if moving or building else POSSIBLE,
            device_full=full,
            before_steps=before_steps,
        )
        elsewhere = _filled_elsewhere(facts, fail)
        if elsewhere is not None:
            summary += (
                f" But the framework held only {format_bytes(fail.oom.allocated_bytes or 0)} "
                f"of a device with {format_bytes(elsewhere)} free: what filled it was not "
                "these weights."
            )
            signals = signals.at_most(WEAK)
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm="compare parameter bytes (numel x element size) with the memory there is",
            frameworks=facts.frameworks(fail.oom),
        )


def _filled_elsewhere(facts: Facts, fail: Failure) -> float | None:
    """The free bytes, when the device was full but the framework's own allocations were a
    small share of it: something else (another process, another pool) filled it."""
    oom = fail.oom
    total = facts.device_total(facts.failed_device(oom), oom)
    if not total or oom.allocated_bytes is None or oom.free_bytes is None:
        return None
    full = little_free(oom.free_bytes, total)
    small = oom.allocated_bytes < SMALL_SHARE * total
    return float(oom.free_bytes) if full and small else None


def _building(fail: Failure) -> bool:
    """Inside a module's constructor or initialiser, not in a forward or backward pass; or,
    in TensorFlow, in the op that initialises a variable (`.../kernel/Initializer/...`)."""
    in_constructor = fail.stack_cues.building_weights
    return (in_constructor and fail.stack_cues.phase is None) or said(fail).variable_initializer


def _initializing_outside_a_loop(facts: Facts, fail: Failure) -> bool:
    """A framework failed making a tensor of random values before any step and outside any
    loop phase: a TensorFlow variable's initializer (a model building its weights when first
    called), a JAX program drawing its parameters with `jax.random` or an initializer; not
    dropout or a batch of noise, which come inside or after steps."""
    drawing = fills_random_values(fail.oom.op) or fail.stack_cues.drawing_random
    if facts.is_text_only or not drawing or fail.stack_cues.phase:
        return False
    return not facts.stepped_before(fail.t) and facts.phase_at(fail.t, fail.pid) is None


def _in_a_constructor(fail: Failure) -> bool:
    """The innermost frame is an `__init__` outside any forward or backward pass: a library
    (faster-whisper, ONNX Runtime) loading its weights to the device as it is built."""
    return fail.stack_cues.in_constructor and fail.stack_cues.phase is None


def _fill_evidence(facts: Facts, fail: Failure) -> tuple[list[Evidence], bool, float | None]:
    """What was already held where the parameters go, and whether that filled it."""
    oom = fail.oom
    if not facts.is_text_only and facts.on_host(oom):
        limits = facts.host_limits(fail.pid, fail.host)
        resident = facts.resident_at_failure(fail)
        if not limits or resident is None:
            return [], False, None
        evidence = [
            bytes_evidence("resident memory of the process", resident),
            bytes_evidence(limits[0].label, limits[0].limit_bytes),
            share_evidence("resident / limit", resident / limits[0].limit_bytes),
        ]
        return evidence, resident >= WEIGHTS_FILL * limits[0].limit_bytes, resident
    total = facts.device_total(facts.failed_device(oom), oom)
    if oom.allocated_bytes is None or not total:
        return [], False, None
    evidence = [
        bytes_evidence("allocated while loading", oom.allocated_bytes),
        share_evidence("of the device", oom.allocated_bytes / total),
    ]
    return evidence, oom.allocated_bytes >= WEIGHTS_FILL * total, oom.allocated_bytes


RULE = ModelTooLarge()
