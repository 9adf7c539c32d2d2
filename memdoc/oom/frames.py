"""A traceback's frames: read from an error text, taken apart, and matched by where they run."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memdoc.oom.logtext import strip_prefix
from memdoc.oom.names import has_words
from memdoc.oom.patterns import compile_later

TRACEBACK_START = "Traceback (most recent call last)"
# Python's frame line: `File "/x/train.py", line 12, in main`.
_FRAME_LINE = compile_later(
    r'^File "(?P<file>[^"]{1,500})", line (?P<line>\d{1,9}), in (?P<function>\S{1,200})'
)
# A frame as traces hold it: "file:line:function" (the file may hold colons, as on Windows).
_FRAME = compile_later(r"^(?P<file>.*):(?P<line>\d+):(?P<function>[^:]*)$")
_PATH_SEPARATORS = compile_later(r"[/\\]")


def read_traceback(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    """Frames ("file:line:function") and their code lines of the last traceback in `lines`."""
    stripped = [strip_prefix(line) for line in lines]
    starts = [i for i, line in enumerate(stripped) if line.startswith(TRACEBACK_START)]
    begin = starts[-1] if starts else 0
    stack: list[str] = []
    source: list[str] = []
    for index in range(begin, len(stripped)):
        match = _FRAME_LINE.match(stripped[index])
        if match is None:
            continue
        stack.append(f"{match['file']}:{match['line']}:{match['function']}")
        following = stripped[index + 1] if index + 1 < len(stripped) else ""
        if following and not _FRAME_LINE.match(following) and not following.startswith("^"):
            source.append(following)
    return stack, source


def frame_parts(frame: str) -> tuple[str, int | None, str]:
    """("train.py", 12, "main") from "train.py:12:main"; tolerant of odd frames."""
    match = _FRAME.match(frame)
    if match is None:
        return frame, None, ""
    return match["file"], int(match["line"]), match["function"]


def file_name(path: str) -> str:
    """ "train.py" from "/any/path/train.py" or "C:\\any\\train.py"."""
    return _PATH_SEPARATORS.split(path)[-1]


def in_file(path: str, file_pattern: str) -> bool:
    """True when `file_pattern` (a pattern of a library's files) is anywhere in the path."""
    return re.search(file_pattern, path, re.IGNORECASE) is not None


def frame_matches(
    frame: str,
    file_pattern: str = "",
    function_pattern: str = "",
    *,
    function_words: Sequence[str] = (),
    file_words: Sequence[str] = (),
) -> bool:
    """True when the frame passes every test given: the file pattern anywhere in its path,
    the function pattern as the whole function name, and one of the phrases as whole words
    of the function name or of the path ("load" is not in "dataloader")."""
    file, _, function = frame_parts(frame)
    if not in_file(file, file_pattern):
        return False
    if not re.fullmatch(function_pattern or ".*", function, re.IGNORECASE):
        return False
    if function_words and not has_words(function, function_words):
        return False
    return not file_words or has_words(file, file_words)
