"""A memory error told in one short line: a report's title, a notebook's last words.

"GPU 0 out of memory even if assigning one GPU for each model", "CUDA OOM when loading
optimizer state dict", '"Killed" without error during "from_pretrained"'. Such a line
names the failure without the framework's wording, so no other parser reads it. Only a text
of a few short lines counts: in a longer log, "OOM" or "killed" in passing is not an error.
"""

from __future__ import annotations

import re

from memdoc.kinds import OomKind
from memdoc.oom.context import framework_in
from memdoc.oom.disguised import ADVICE, GPU_WORDS_PATTERN
from memdoc.oom.host import OTHER_KILLER
from memdoc.oom.logtext import Hit, LogText, rank_of, strip_prefix
from memdoc.oom.patterns import compile_later
from memdoc.trace.model import OomInfo

# A headline: at most this many non-blank lines, each at most this long.
MAX_LINES = 3
MAX_CHARS = 240

_DEVICE_MEMORY = compile_later(
    r"\bout[ -]?of[ -]memory\b|\bOOM(?:s|ed)?\b|\bmemory error\b"
    # The class named as what happened ("inference CUDA OutOfMemoryError", "... on older
    # GPU"), not as the subject of a sentence ("OutOfMemoryError is raised when ...").
    r"|\bOutOfMemoryError\b(?=\s*$|\s*[:(]|\s+(?:on|when|in|with|during|while|after|at|for)\b)"
    r"|\bout of (?:gpu |vram |cuda |device |video )?memory\b"
    r"|\b(?:device|gpu|cuda) allocation (?:error|failed)\b"
    # Chinese: video memory (显存) or memory (内存) not enough, overflowing, blown up.
    r"|(?:显存|内存)(?:不足|不够|溢出|爆了|爆炸|泄露|泄漏)|爆(?:显存|内存)",
    re.I,
)
# The shell's own word, quoted by whoever wrote the line ('"Killed" without any error'), or
# leading a description of when ("Killed during from_pretrained"): not "Killed the old run".
_KILLED = compile_later(
    r"^[\"'`“‘]Killed[\"'`”’]"
    r"|^Killed\b\s*(?:$|[-–:(.,]|(?:without|during|while|when|after|at|on|in)\b)"
    # "Training killed", "python process gets killed while loading"
    r"|\b(?:training|process|job|script|kernel|python|run|program|worker)\s+"
    r"(?:was\s+|got\s+|gets\s+|is\s+|being\s+)?killed\b",
    re.I,
)
# Something named as killing the process because of its memory: "Mistral kills the process by
# taking too many RAM", "loading the dataset kills the kernel (out of RAM)".
_KILLS_FOR_MEMORY = compile_later(
    r"\bkill(?:s|ed|ing)?\s+(?:the\s+|my\s+|our\s+)?(?:process|kernel|job|session|training)"
    r"\b.{0,80}(?:too (?:much|many) (?:RAM|memory)|out of (?:RAM|memory)"
    r"|(?:RAM|memory) (?:is |was )?(?:full|exhausted))",
    re.I,
)
# A line of code that quotes the words: `if "out of memory" in str(e):`.
_CODE = compile_later(
    r"^(?:raise|return|print|assert)\b.*[(\"']"
    r"|\bin str\(|==\s{0,3}[\"']|:\s*$"
)
_HOST_WORDS = compile_later(r"\b(?:RAM|host memory|system memory|CPU memory|swap)\b|内存", re.I)
# Not a failure: "how to avoid OOM", "no OOM", "not out of memory", "OOM-free".
_NOT_AN_ERROR = compile_later(
    r"\b(?:avoid|avoiding|prevent|preventing|without|no|not|never|reduce|reducing)\s+"
    r"(?:an?\s+|the\s+|any\s+)?(?:cuda\s+|gpu\s+)?(?:oom|out[ -]?of[ -]?memory|memory error)"
    r"|\b(?:oom|out[ -]of[ -]memory)[ -]free\b"
    r"|(?:避免|防止|减少|没有|不会)\s?(?:显存|内存)",  # "how to avoid running out of VRAM"
    re.I,
)


def _headline_lines(log: LogText) -> list[tuple[int, str]]:
    """The text's non-blank lines (index, text) when it is a headline, else nothing."""
    lines = [(index, strip_prefix(raw)) for index, raw in enumerate(log.lines) if raw.strip()]
    if len(lines) > MAX_LINES or any(len(text) > MAX_CHARS for _, text in lines):
        return []
    return lines


def find(log: LogText) -> list[Hit]:
    """The headline's memory error, when the whole text is a headline that states one."""
    lines = _headline_lines(log)
    for index, text in lines:
        if _NOT_AN_ERROR.search(text) or ADVICE.search(text) or _CODE.search(text):
            continue
        killed = _KILLED.search(text) or _KILLS_FOR_MEMORY.search(text)
        if killed and not OTHER_KILLER.search(text):
            info = _info(text, OomKind.HOST_KILL, framework="host", device_type="cpu")
            return [Hit(line=index, end=index, info=info, rank=info.rank, weak=True)]
        if _DEVICE_MEMORY.search(text) is None:
            continue
        if _HOST_WORDS.search(text) and not GPU_WORDS_PATTERN.search(text):
            info = _info(text, OomKind.HOST_ALLOC, framework="host", device_type="cpu")
        else:
            named = framework_in(text.lower()) or "unknown"
            info = _info(
                text, OomKind.DISGUISED, framework=named, device_type="gpu", library="cuda"
            )
        return [Hit(line=index, end=index, info=info, rank=info.rank, weak=True)]
    return []


def _info(
    text: str,
    kind: str,
    *,
    framework: str,
    device_type: str,
    library: str | None = None,
) -> OomInfo:
    return OomInfo(
        framework=framework,
        kind=kind,
        message=text,
        device_type=device_type,
        library=library,
        rank=rank_of(text),
    )
