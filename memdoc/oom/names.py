"""Word-wise matching of function, file and op names: `test` is not in "latest"."""

from __future__ import annotations

from collections.abc import Iterable

from memdoc.oom.patterns import compile_later

# A word of an identifier: an upper-case run (CUDA in CUDAGraph), a capitalised or lower-case
# run with the digits and letter that follow it (Conv2d, conv1d), or digits alone.
_WORD = compile_later(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+(?:\d+[a-zA-Z](?![a-z])|\d+)?|\d+")


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


def has_stem(name: str, stems: Iterable[str]) -> bool:
    """True when one of the stems is anywhere in `name`, without case: "valid" is in
    "Validation", "sampl" in "sampling"."""
    lower = name.lower()
    return any(stem in lower for stem in stems)


# TensorFlow ops that fill a new tensor with random values: what a variable's initializer
# runs (Keras's default initializers are glorot_uniform, random uniform for embeddings,
# truncated normal), and dropout inside a step. Outside any step they build weights.
_RANDOM_FILL_OPS = frozenset(
    {
        "RandomUniform",
        "RandomUniformInt",
        "RandomStandardNormal",
        "TruncatedNormal",
        "StatelessRandomUniform",
        "StatelessRandomUniformV2",
        "StatelessRandomUniformInt",
        "StatelessRandomUniformIntV2",
        "StatelessRandomNormal",
        "StatelessRandomNormalV2",
        "StatelessTruncatedNormal",
        "StatelessTruncatedNormalV2",
        "StatelessRandomUniformFullInt",
        "StatelessRandomUniformFullIntV2",
    }
)


def fills_random_values(op: str | None) -> bool:
    """The op (as TensorFlow names it, `[Op:...]`) makes a tensor of random values."""
    return op is not None and op.rsplit("/", 1)[-1] in _RANDOM_FILL_OPS
