"""The plain-words paragraph that says what a memory error's numbers mean."""

from __future__ import annotations

from memdoc.kinds import OomKind
from memdoc.rules.facts import LIBRARY_NAMES, library_name
from memdoc.trace.ledger import oom_this_process_bytes
from memdoc.trace.model import OomInfo
from memdoc.units import format_bytes

_FRAMEWORKS = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "jax": "XLA"}
_HOST = {
    OomKind.HOST_KILL: "The process was killed (SIGKILL), which is what the kernel's "
    "out-of-memory killer, or a scheduler enforcing a memory limit, does when the machine, "
    "container or job runs out of RAM.",
    OomKind.DATALOADER_KILLED: "A DataLoader worker process was killed; when the signal is "
    "SIGKILL, the out-of-memory killer is the usual sender.",
    OomKind.SHM: "A worker ran out of shared memory (/dev/shm), which holds the batches workers "
    "pass to the main process.",
    OomKind.HOST_ALLOC: "An allocation in host memory (RAM) failed.",
}
# A library whose refusal says more than "out of memory in disguise": its headline and its
# paragraph. Other libraries get the general wording.
_DISGUISES = {
    "vllm": (
        "vLLM's KV cache does not fit",
        "vLLM refused to start: of the share of the device it may use, what the weights and a "
        "profiled forward pass left cannot hold the KV cache of one sequence of max_model_len "
        "tokens.",
    ),
    "rmm": (
        "RAPIDS' memory pool (RMM) could not allocate",
        "RMM, the device allocator of RAPIDS (cuDF, cuML), could not get device memory: its pool "
        "reached the maximum size it was given, or the device itself was full.",
    ),
}


# The runtime itself said it ran out: not a disguise, whatever library it came through.
_RUNTIMES = {"cuda": "CUDA", "hip": "HIP", "vulkan": "Vulkan"}


def disguise_headline(oom: OomInfo) -> str:
    """What a disguised out-of-memory error is, in the headline's few words."""
    if oom.library in _DISGUISES:
        return _DISGUISES[oom.library][0]
    if oom.library in _RUNTIMES:
        return f"a {_RUNTIMES[oom.library]} call ran out of memory"
    return f"{library_name(oom)} failed: an out-of-memory error in disguise"


def size(num_bytes: float) -> str:
    """Bytes for a sentence: "226 MiB", "15.6 GiB"."""
    return format_bytes(num_bytes).replace(".0 ", " ")


def explain_in_words(oom: OomInfo) -> str:
    """One paragraph: what was asked for, what the device had, and who held the rest."""
    if oom.kind in _HOST:
        text = _HOST[oom.kind]
        if oom.requested_bytes:
            text = text[:-1] + f"; the request was {size(oom.requested_bytes)}."
        if oom.limit_bytes:
            text = text[:-1] + f"; the limit was {size(oom.limit_bytes)}."
        return text
    if oom.kind == OomKind.DISGUISED and oom.library in _DISGUISES:
        return _DISGUISES[oom.library][1]
    if oom.kind == OomKind.DISGUISED and oom.library in LIBRARY_NAMES:
        return (
            f"This is an out-of-memory error in disguise: {LIBRARY_NAMES[oom.library]} could not "
            "get the device memory it needs (for its handle, workspace or buffers)."
        )
    where = _where(oom)
    clauses: list[str] = []
    if oom.total_bytes and oom.free_bytes is not None:
        clauses.append(f"Of {size(oom.total_bytes)} on {where}, {size(oom.free_bytes)} were free")
    elif oom.total_bytes:
        clauses.append(f"{where[0].upper()}{where[1:]} has {size(oom.total_bytes)}")
    elif oom.free_bytes is not None:
        clauses.append(f"{size(oom.free_bytes)} were free on {where}")
    holding = _holding(oom)
    if holding:
        clauses.append(holding)
    others = [p for p in oom.processes if not p.this_process and p.used_bytes]
    if others and oom_this_process_bytes(oom) is not None:
        clauses.append(
            f"{len(others)} other process{'es' if len(others) > 1 else ''} held "
            f"{size(sum(p.used_bytes or 0 for p in others))}"
        )
    if oom.limit_bytes:
        clauses.append(f"a cap of {size(oom.limit_bytes)} was configured")
    clauses.append(_program(oom))
    clauses.append(_request(oom))
    text = "; ".join(c for c in clauses if c)
    return text[0].upper() + text[1:] + "."


def _program(oom: OomInfo) -> str:
    """XLA's buffer assignment: the program's total and its parts, where the text gives them."""
    parts = [
        f"{label} {size(value)}"
        for label, value in (
            ("parameters", oom.xla_parameter_bytes),
            ("outputs", oom.xla_output_bytes),
            ("temporaries", oom.xla_temp_bytes),
        )
        if value is not None
    ]
    if oom.xla_total_bytes:
        detail = f" ({', '.join(parts)})" if parts else ""
        return f"the compiled program's buffers came to {size(oom.xla_total_bytes)}{detail}"
    if oom.xla_temp_bytes:
        return f"the compiled program needed {size(oom.xla_temp_bytes)} of temporaries"
    return ""


def _short_source(source: str) -> str:
    """ "models.py:689" from "/long/path/models.py:689"."""
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def _where(oom: OomInfo) -> str:
    if oom.device is None:
        return "the device"
    kind = (oom.device_type or "gpu").upper()
    return "the host" if oom.device < 0 else f"{kind} {oom.device}"


def _holding(oom: OomInfo) -> str:
    framework = _FRAMEWORKS.get(oom.framework, "the framework")
    cached = oom.reserved_unallocated_bytes
    if cached is None and oom.reserved_bytes is not None and oom.allocated_bytes is not None:
        cached = oom.reserved_bytes - oom.allocated_bytes
    inner = ""
    if oom.allocated_bytes is not None:
        inner = f"{framework} had allocated {size(oom.allocated_bytes)}"
        if oom.private_pool_bytes:
            inner += f" ({size(oom.private_pool_bytes)} in CUDA-graph private pools)"
        if cached is not None:
            inner += f" and cached {size(cached)} but not used it"
    own = oom_this_process_bytes(oom)
    if own is not None:
        held = f"this process held {size(own)}"
        return f"{held}, of which {inner}" if inner else held
    if oom.reserved_bytes is not None and inner:
        return f"{framework} held {size(oom.reserved_bytes)}, of which it{inner[len(framework) :]}"
    if oom.bfc_in_use_bytes is not None and oom.bfc_limit_bytes:
        in_use, limit = size(oom.bfc_in_use_bytes), size(oom.bfc_limit_bytes)
        return f"its allocator had {in_use} of its {limit} limit in use"
    return inner


def _request(oom: OomInfo) -> str:
    if oom.requested_unknown_huge:
        return "the request was absurdly large, beyond any device: a size computation went wrong"
    what = "the request was"
    if oom.shape is not None:
        what = (
            f"the tensor of shape {list(oom.shape)}{f' ({oom.dtype})' if oom.dtype else ''} needed"
        )
    if oom.xla_buffers and oom.op:
        where = f" at {_short_source(oom.source)}" if oom.source else ""
        what = f"the largest buffer, {oom.op}{where}, " + what.replace("the tensor", "a tensor")
    if oom.requested_bytes:
        return f"{what} {size(oom.requested_bytes)}"
    if oom.shape is not None:
        return f"a tensor of shape {list(oom.shape)} did not fit"
    framework = _FRAMEWORKS.get(oom.framework)
    owner = f"{framework} " if framework else ""
    if oom.total_bytes or oom.bfc_in_use_bytes is not None or oom.reserved_bytes is not None:
        return "the message does not say how much was requested"
    return f"{owner}ran out of memory on {_where(oom)}; the message gives no sizes"
