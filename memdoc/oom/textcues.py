"""What the words of a device memory error and the log around it say, each idea from one table."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from memdoc.oom.patterns import Pattern, compile_later

# Each table is one idea: a row is a phrase (a pattern, matched without case) and where it
# was seen. A text says the idea when any row matches the message, the log around it or the
# traceback's code.

# TensorFlow's cuDNN autotuner refusing an algorithm whose scratch space exceeds its own cap,
# a configured limit rather than a full device (tensorflow/tensorflow#53116).
WORKSPACE_LIMIT = (
    r"exceeds the memory limit of",  # "... needs N bytes, exceeds the memory limit of M"
    r"No algorithm worked",
    r"Profiling failure on CUDNN",
)

# XLA's own words for a failed allocation on a device (jax_privacy#10, cupy#7678 for the
# "allocating" form, RESOURCE_EXHAUSTED as the status every XLA client reports).
XLA_OUT_OF_MEMORY = (
    r"Out\s+of\s+memory\s+while\s+trying\s+to\s+allocate",
    r"Out\s+of\s+memory\s+allocating",
    r"Failed to allocate request for",
    r"RESOURCE_EXHAUSTED",
)

# XLA showing its compiled program's buffer plan (mujoco#1431, flowpm#27, AFProfile#8).
XLA_BUFFER_PLAN = (
    r"by rematerialization",  # "Can't reduce memory use below N by rematerialization"
    r"HLO temp",
    r"Program hbm requirement",  # the TPU's summary of a program's memory
    r"BufferAssignment",
)

# TensorFlow and JAX compiling a function again for new shapes: tf.function's warning, and
# the compilers' "Recompiling" and "recompiled ... shape/static" notices.
RETRACING = (
    r"triggered tf\.function retracing",
    r"Recompiling",
    r"recompil(?:ed|ation) .*(?:shape|static)",
)

# A backward pass told to keep its graph (pytorch/pytorch#40005).
RETAIN_GRAPH = (
    r"retain_graph\s*=\s*True",
    r"create_graph\s*=\s*True",
)

# PyTorch's warning that `volatile=True` no longer turns gradients off (mmskeleton#45).
VOLATILE = (r"volatile was removed and now has no effect",)

# An optimizer making its per-parameter state: TensorFlow's slot variables named after the
# optimizer ("Adam/Initializer", UnFlow#32), and PyTorch's step and state initialisation.
OPTIMIZER_STATE = (
    r"/(?:Adam|AdamW|Adagrad|RMSProp|Momentum)(?:_\d+)?/",
    r"Adam/Initializer",
    r"optimizer\.step\(",
    r"_init_group",
    r"_multi_tensor_adam",
)

# Weights being loaded onto or moved to the device: Hugging Face's shard loading
# (pyllama#40) and `from_pretrained(` (Qwen-VL#26), and torch's `.to("cuda")` / `.cuda()`.
MOVING_WEIGHTS = (
    r"Loading checkpoint shards",
    r"\.from_pretrained\(",
    r"\.to\((?:\"|')?cuda",
    r"\.cuda\(\)",
)

# A TensorFlow node that fills a variable with its initial value (bilm-tf#195).
VARIABLE_INITIALIZER = (r"\[\[\{?\{?node [\w/.-]{0,300}/Initializer/",)

# A checkpoint being read into memory: torch's load (neural-dream#6), a state dict being
# loaded (transformer-lm#21), a restore.
CHECKPOINT_LOADING = (
    r"torch\.load\(",
    r"load_state_dict\(",
    r"\.restore\(",
    r"\bloading (?:the )?state[ _]dict",
)

# A CUDA graph being captured or replayed: PyTorch's names (vllm#19186, vllm#15598) and
# vLLM's log as it captures (worker-vllm#40).
CUDA_GRAPH_CAPTURE = (
    r"capture_end",
    r"capture_begin",
    r"CUDAGraph",
    r"cuda_graph",
    r"cudagraph",
    r"graph capture",
    r"Capturing the model for CUDA graphs",
    r"CUDA graphs can take additional",
)

# How a text names each framework: its package in a path or a call, or its name in words.
FRAMEWORKS_NAMED = (
    ("pytorch", r"\bpytorch\b|\btorch[./]"),
    # not jaxlib's vendored copy ("external/org_tensorflow/tensorflow/compiler/xla")
    ("tensorflow", r"(?<!org_tensorflow/)\btensorflow\b"),
    ("jax", r"\bjax(?:lib)?\b"),
)


@dataclass(frozen=True)
class TextCues:
    """What the words around a device memory error say, each read from its own table."""

    workspace_limit: bool = False  # a library's configured scratch cap refused, not a full device
    xla_out_of_memory: bool = False  # XLA's words for a failed allocation
    xla_buffer_plan: bool = False  # XLA showed its compiled program's buffers
    retracing: bool = False  # a function compiled again for new shapes
    retain_graph: bool = False  # a backward pass keeps its graph
    volatile: bool = False  # `volatile=True` was relied on to turn gradients off
    optimizer_state: bool = False  # an optimizer making its per-parameter state
    moving_weights: bool = False  # weights loaded onto or moved to the device
    variable_initializer: bool = False  # a TensorFlow variable being given its initial value
    checkpoint_loading: bool = False  # a checkpoint being read
    cuda_graph_capture: bool = False  # a CUDA graph captured or replayed
    frameworks_named: tuple[str, ...] = ()  # in the order of FRAMEWORKS_NAMED


def _pattern(rows: Iterable[str]) -> Pattern:
    return compile_later("|".join(rows), re.IGNORECASE)


_WORKSPACE_LIMIT = _pattern(WORKSPACE_LIMIT)
_XLA_OUT_OF_MEMORY = _pattern(XLA_OUT_OF_MEMORY)
_XLA_BUFFER_PLAN = _pattern(XLA_BUFFER_PLAN)
_RETRACING = _pattern(RETRACING)
_RETAIN_GRAPH = _pattern(RETAIN_GRAPH)
_VOLATILE = _pattern(VOLATILE)
_OPTIMIZER_STATE = _pattern(OPTIMIZER_STATE)
_MOVING_WEIGHTS = _pattern(MOVING_WEIGHTS)
_VARIABLE_INITIALIZER = _pattern(VARIABLE_INITIALIZER)
_CHECKPOINT_LOADING = _pattern(CHECKPOINT_LOADING)
_CUDA_GRAPH_CAPTURE = _pattern(CUDA_GRAPH_CAPTURE)
_FRAMEWORKS_NAMED = tuple((name, _pattern((row,))) for name, row in FRAMEWORKS_NAMED)


def text_cues(texts: Iterable[str]) -> TextCues:
    """The cues in `texts` (an error's message, the log around it, its traceback's code)."""
    said = tuple(text for text in texts if text)
    return TextCues(
        workspace_limit=_any(_WORKSPACE_LIMIT, said),
        xla_out_of_memory=_any(_XLA_OUT_OF_MEMORY, said),
        xla_buffer_plan=_any(_XLA_BUFFER_PLAN, said),
        retracing=_any(_RETRACING, said),
        retain_graph=_any(_RETAIN_GRAPH, said),
        volatile=_any(_VOLATILE, said),
        optimizer_state=_any(_OPTIMIZER_STATE, said),
        moving_weights=_any(_MOVING_WEIGHTS, said),
        variable_initializer=_any(_VARIABLE_INITIALIZER, said),
        checkpoint_loading=_any(_CHECKPOINT_LOADING, said),
        cuda_graph_capture=_any(_CUDA_GRAPH_CAPTURE, said),
        frameworks_named=tuple(name for name, named in _FRAMEWORKS_NAMED if _any(named, said)),
    )


def _any(pattern: Pattern, texts: tuple[str, ...]) -> bool:
    return any(pattern.search(text) for text in texts)


# What the error's own message says, apart from the log around it.

# PyTorch's wording when a CUDA runtime call (not its caching allocator) ran out of memory.
CUDA_RUNTIME_CALL = "cuda error: out of memory"
# vLLM refusing to start because its KV cache cannot hold one sequence of max_model_len:
# "The model's max seq len (4096) is larger than the maximum number of tokens that can be
# stored in KV cache (3664)", or "No available memory for the cache blocks".
KV_MAX_LEN = r"max seq len \((\d{1,9})\)"
KV_TOKENS_THAT_FIT = r"stored in KV cache \((\d{1,12})\)"
KV_NOTHING_LEFT = "no available memory"


@dataclass(frozen=True)
class MessageCues:
    """What an error's own message says beyond its figures, each read from its own phrase."""

    cuda_runtime_call: bool = False  # a CUDA runtime call failed, not PyTorch's allocator
    kv_max_len: int | None = None  # the context length vLLM was asked for
    kv_tokens_that_fit: int | None = None  # the tokens vLLM's KV cache could hold
    kv_nothing_left: bool = False  # nothing at all was left for vLLM's KV cache


_KV_MAX_LEN = compile_later(KV_MAX_LEN, re.IGNORECASE)
_KV_TOKENS_THAT_FIT = compile_later(KV_TOKENS_THAT_FIT, re.IGNORECASE)


def message_cues(message: str) -> MessageCues:
    """The cues in an error's own message."""
    lower = message.lower()
    return MessageCues(
        cuda_runtime_call=CUDA_RUNTIME_CALL in lower,
        kv_max_len=_number(_KV_MAX_LEN, message),
        kv_tokens_that_fit=_number(_KV_TOKENS_THAT_FIT, message),
        kv_nothing_left=KV_NOTHING_LEFT in lower,
    )


def _number(pattern: Pattern, text: str) -> int | None:
    found = pattern.search(text)
    return int(found.group(1)) if found is not None else None
