"""Inference servers' own memory errors: vLLM's KV cache that does not fit at start-up.

vLLM sizes its KV cache once, at start: of the device it may use (`gpu_memory_utilization`,
0.9 unless set), what the weights and a profiled forward pass leave goes to the cache. When
that cache cannot hold one sequence of `max_model_len` tokens, the engine refuses to start.
Three settings move it: a shorter `max_model_len` (or fewer `max_num_seqs`), a larger
`gpu_memory_utilization`, or smaller weights (a quantized model, more GPUs).
"""

from __future__ import annotations

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure, message_said
from memdoc.rules.spec import RuleSpec, count_evidence

# A context length a KV cache of N tokens holds, rounded down to this many tokens.
CONTEXT_STEP = 256
# What to suggest when vLLM did not say how many tokens its cache holds.
SHORTER_CONTEXT = 8192


def shorter_context_fix(fail: Failure) -> Fix:
    """A shorter context: one that fits the tokens the cache could hold, where vLLM said."""
    fits = message_said(fail).kv_tokens_that_fit
    length = SHORTER_CONTEXT
    if fits is not None:
        length = max(CONTEXT_STEP, fits // CONTEXT_STEP * CONTEXT_STEP)
    return Fix(
        "pytorch",
        "Give vLLM a shorter context (and fewer sequences at once)",
        f"vllm serve MODEL --max-model-len {length} --max-num-seqs 64",
        language="bash",
    )


MORE_OF_THE_DEVICE_FIX = Fix(
    "pytorch",
    "Let vLLM use more of the device (nothing else may be on it)",
    "vllm serve MODEL --gpu-memory-utilization 0.95",
    language="bash",
)
SMALLER_WEIGHTS_FIX = Fix(
    "pytorch",
    "Shrink what the weights take: a quantized checkpoint, or split over GPUs",
    "vllm serve MODEL-AWQ --quantization awq\nvllm serve MODEL --tensor-parallel-size 2",
    language="bash",
)


def kv_cache_short(fail: Failure) -> bool:
    """vLLM refused to start: its KV cache would not hold one sequence of max_model_len."""
    return fail.oom.library == "vllm"


def kv_cache_empty(fail: Failure) -> bool:
    """Nothing at all was left for the cache: the weights (or another process) took it all,
    which no shorter context mends."""
    return kv_cache_short(fail) and message_said(fail).kv_nothing_left


def kv_cache_evidence(fail: Failure) -> list[Evidence]:
    """The context length asked for and the tokens the cache could hold, where vLLM said."""
    said = message_said(fail)
    return [
        count_evidence(label, count)
        for label, count in (
            ("max_model_len asked for", said.kv_max_len),
            ("tokens the KV cache could hold", said.kv_tokens_that_fit),
        )
        if count is not None
    ]


def kv_cache_finding(
    rule: RuleSpec,
    facts: Facts,
    fail: Failure,
    signals: Signals,
    summary: str,
    *,
    to_confirm: str,
    fix: Fix,
) -> Finding:
    """One rule's reading of a KV cache that did not fit, with the one setting it names."""
    return rule.finding(
        facts,
        signals,
        summary,
        kv_cache_evidence(fail),
        to_confirm=to_confirm,
        frameworks=["pytorch"],
        fixes=(fix,),
    )
