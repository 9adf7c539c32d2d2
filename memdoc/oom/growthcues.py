"""What the log before an error says of memory growing: how far the run got, what was kept."""

from __future__ import annotations

import re
from dataclasses import dataclass

from memdoc.oom.patterns import Pattern, compile_later

# How much of the end of each text is read: the log right before the error.
TAIL_CHARS = 20_000

# How a log counts its progress: "epoch 12", "Epoch 37/100", "iteration 5000", "step: 800",
# "1000th epoch".
PROGRESS = (
    r"\b(?:epoch|iteration|iter|step)\s*[:#=]?\s*(\d{1,9})\b",
    r"\b(\d{1,9})(?:st|nd|rd|th)\s+(?:epoch|iteration|step)",
)

# What a person writes when memory grows: "memory leak", "leaks", "memory keeps increasing",
# or results kept batch after batch ("aggregates predictions on GPU").
LEAK_WORDS = (
    r"\bmemory[ -]leak(?:s|ing|age)?\b",
    r"\bleak(?:s|ing)?\s+(?:gpu\s+|cuda\s+)?memory\b",
    r"\bmemory\s+(?:keeps|kept|is|was)\s+(?:increasing|growing|rising)\b",
    r"\b(?:accumulat|aggregat|append|collect)(?:es|ed|ing|e|s)?\s+(?:all\s+(?:the\s+)?|the\s+)?"
    r"(?:predictions|outputs|logits|losses|embeddings)\b",
)

# Hugging Face's Trainer keeps every evaluation batch's logits on the device until
# compute_metrics runs, unless told otherwise: the settings that say so, by their names
# (DNABERT_2#78). Matched with case: they are Python names.
KEPT_FOR_METRICS = (
    r"\bcompute_metrics\b",
    r"\beval_accumulation_steps\b",
    r"\bpreprocess_logits_for_metrics\b",
)


@dataclass(frozen=True)
class GrowthCues:
    """What the error and the log before it say of memory growing, each from its own table."""

    progress: int | None = None  # the furthest epoch, iteration or step the log counted
    leak_words: str | None = None  # the first phrase that speaks of a leak, as written
    kept_for_metrics: str | None = None  # the first of Trainer's metric settings named


_PROGRESS = compile_later("|".join(PROGRESS), re.IGNORECASE)
_LEAK_WORDS = compile_later("|".join(LEAK_WORDS), re.IGNORECASE)
_KEPT_FOR_METRICS = compile_later("|".join(KEPT_FOR_METRICS))


def growth_cues(message: str, context: str) -> GrowthCues:
    """The cues in an error's message and the log around it (the last TAIL_CHARS of each)."""
    tails = tuple(text[-TAIL_CHARS:] for text in (message, context) if text)
    joined = " ".join(tails)
    numbers = [
        int(found.group(1) or found.group(2))
        for tail in tails
        for found in _PROGRESS.finditer(tail)
    ]
    return GrowthCues(
        progress=max(numbers) if numbers else None,
        leak_words=_phrase(_LEAK_WORDS, joined),
        kept_for_metrics=_phrase(_KEPT_FOR_METRICS, joined),
    )


def _phrase(pattern: Pattern, text: str) -> str | None:
    found = pattern.search(text)
    return found.group(0) if found is not None else None
