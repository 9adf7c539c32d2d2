"""Word-wise matching of function, file and op names: `test` is not in "latest"."""

from __future__ import annotations

import re
from collections.abc import Iterable

# A word of an identifier: an upper-case run (CUDA in CUDAGraph), a capitalised or lower-case
# run with the digits and letter that follow it (Conv2d, conv1d), or digits alone.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+(?:\d+[a-zA-Z](?![a-z])|\d+)?|\d+")


def name_words(name: str) -> tuple[str, ...]:
    """The lower-case words of a name: "_load_pretrained_model" -> (load, pretrained, model),
    "CUDAGraph.replay" -> (cuda, graph, replay), "DataLoader" -> (data, loader)."""
    return tuple(word.lower() for word in _WORD.findall(name))


def has_words(name: str, phrases: Iterable[str]) -> bool:
    """True when the words of one phrase ("cuda graph", "eval") appear in a row in `name`."""
    words = name_words(name)
    for phrase in phrases:
        wanted = tuple(phrase.lower().split())
        width = len(wanted)
        if any(words[i : i + width] == wanted for i in range(len(words) - width + 1)):
            return True
    return False
