"""A log as lines: fast case-insensitive anchors, bounded windows, launcher prefixes removed."""

from __future__ import annotations

import re
import string
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from memdoc.oom.patterns import Pattern, compile_later
from memdoc.trace.model import OomInfo

_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

# What launchers and test runners put before every line: torchrun's `[rank0]:`, its
# `--tee` form `[default0]:`, mpirun's `[1,3]<stderr>:`, Ray's `(pid=123)` and pytest's
# `E   `. Bounded repetition keeps this linear on any line.
_PREFIX = compile_later(
    r"^\s{0,40}(?:(?:\[rank\d{1,6}\]:|\[default\d{1,6}\]:|\[\d{1,6},\d{1,6}\]<std(?:out|err)>:"
    r"|\([\w.-]{0,60} ?pid=\d{1,10}(?:, ip=[\d.]{1,40})?\)|E {1,12}(?=\S))\s{0,12}){0,4}"
)
_RANK = compile_later(r"^\s{0,40}(?:\[rank(\d{1,6})\]:|\[\d{1,6},(\d{1,6})\]<std(?:out|err)>:)")

# A line that starts a new record, so a message cannot continue onto it.
_RECORD_START = compile_later(
    r"(?:Traceback \(most recent call last\)|During handling of the above|The above exception"
    r"|File \"|[IWEF]\d{4} \d\d:\d\d|\[[IWEF]\d{4} |\d{4}-\d\d-\d\d[ T]\d|\[\d{4}-\d\d-\d\d"
    r"|\[\s{0,8}\d{1,12}\.\d{1,9}\]|[IWEF] [\w/.\\:-]{1,200}\.(?:cc|cpp|h|cu):\d{1,6}\]"
    r"|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b|Exception raised from |frame #\d"
    r"|[\w.-]{1,80}:\d{1,10}:\d{1,10} \[\d{1,4}\] |[A-Za-z_][\w.]{0,80}(?:Error|Exception)(?::|$))"
)

# Source lines that a traceback prints, where a message is only quoted or caught:
# `if "CUDA out of memory" in str(e):`, `except torch.OutOfMemoryError:`, a format string.
# Blanks standing for a lost line break, searched backwards: at least eight, then text.
_WIDE_GAP = compile_later(r"\s{8,}(?=\S)")
_SOURCE_LINE = compile_later(
    r"""^(?:["']|(?:if|elif|except|assert|raise|return|for|while|def|with|match|case|\#) )"""
    r"""|\bin str\(|\.format\(|\bstr\(\w{1,20}\)|==\s{0,3}["']"""
)

# Lines longer than this are read only around an anchor: a 1 MB line must cost O(1 MB) once.
LONG_LINE = 4000
MESSAGE_MAX = 2000
# Lines within which an identical line is an echo of the first (see `LogText.anchors`).
ECHO_LINES = 500


def strip_prefix(line: str) -> str:
    """The line without launcher/test-runner prefixes and surrounding blanks."""
    match = _PREFIX.match(line)
    start = match.end() if match else 0
    return line[start:].strip()


def rank_of(line: str) -> int | None:
    """The rank from a `[rankN]:` (torchrun) or `[1,N]<stderr>:` (mpirun) prefix."""
    match = _RANK.match(line)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def is_source_line(part: str) -> bool:
    """Whether a (prefix-stripped) line is program source that quotes a message, not the message."""
    return _SOURCE_LINE.search(part[:300]) is not None


def message_part(line: str, column: int) -> str:
    """Where the message at `column` starts: the whole line, or, when a paste lost its line
    breaks and ran a code line and the error together, what follows the last wide gap of
    blanks before it (`return f(x)        torch.OutOfMemoryError: ...`)."""
    gap = _WIDE_GAP.search(line[:column][::-1])
    return line[column - gap.start() :] if gap is not None else line


def starts_record(part: str) -> bool:
    """Whether a (prefix-stripped) line begins a new log record or traceback."""
    return part == "" or _RECORD_START.match(part) is not None


@dataclass(frozen=True)
class Hit:
    """One piece of evidence a parser found: an error, or context that belongs to one.

    `role` is "error" (stands alone), "prelude" (stands alone, but joins the error that
    follows within `reach` lines, e.g. a BFC dump before TensorFlow's exception) or "note"
    (joins a following error, dropped when none follows). `soft` marks a framework guess
    that a merged error overrides (BFC lines are printed by TensorFlow and by JAX alike).
    `key` identifies the failure (requested size, pid...) so echoes of it can be merged.
    """

    line: int  # 0-based
    end: int  # 0-based, last line the evidence covers
    info: OomInfo
    role: str = "error"
    reach: int = 60
    soft: bool = False
    rank: int | None = None
    key: tuple[object, ...] = ()
    priority: int = 0  # lower wins when two parsers claim the same line
    weak: bool = False  # a generic fallback, dropped where a specific parser read the text


@dataclass
class Window:
    """A message from its anchor on, continuation lines joined, in bounded size."""

    first_line: int
    parts: list[str] = field(default_factory=list)
    last_line: int = 0  # 0-based line of the last part (blank lines may sit between parts)

    @property
    def joined(self) -> str:
        # Joined without separators: a terminal or log wrapper that breaks a long line
        # at a fixed width splits words and numbers ("13.9" / "4 GiB"); the phrase
        # regexes allow any whitespace between words, so nothing is lost either way.
        return "".join(self.parts)

    def search(self, pattern: Pattern) -> re.Match[str] | None:
        """The first match inside one line (for tokens that must not run across lines)."""
        for part in self.parts:
            match = pattern.search(part)
            if match is not None:
                return match
        return None

    def message(self, parts: int | None = None) -> str:
        """The first `parts` lines (all by default) as the error text, capped."""
        text = "\n".join(part.rstrip() for part in self.parts[: parts or len(self.parts)])
        return text[:MESSAGE_MAX]

    def parts_to(self, offset: int) -> int:
        """How many parts are needed to cover `offset` of `joined`."""
        total = 0
        for index, part in enumerate(self.parts):
            total += len(part)
            if offset <= total:
                return index + 1
        return len(self.parts)


class LogText:
    """A text split once into lines, with a lowercase copy for fast anchor search."""

    def __init__(self, text: str) -> None:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        lower = text.lower()
        if len(lower) != len(text):
            # A few non-ASCII letters change length when lowered; keep offsets aligned.
            lower = text.translate(_ASCII_LOWER)
        self.text = text
        self.lower = lower
        self.lines = text.split("\n")
        starts = [0] * len(self.lines)
        offset = 0
        for index, line in enumerate(self.lines):
            starts[index] = offset
            offset += len(line) + 1
        self.starts = starts

    def line_of(self, offset: int) -> int:
        """0-based line holding the character at `offset`."""
        return bisect_right(self.starts, offset) - 1

    def anchors(self, needle: str) -> Iterator[tuple[int, int]]:
        """(line, column) of each line where lowercase `needle` occurs (first per line).

        A line identical to one already seen within `ECHO_LINES` lines is skipped: it is an
        echo that the combiner would merge anyway, and a log of a million identical lines
        must not cost a million parses.
        """
        text = self.lower
        pos = text.find(needle)
        last_text: str | None = None
        last_line = -ECHO_LINES - 1
        while pos >= 0:
            line = self.line_of(pos)
            raw = self.lines[line]
            if raw != last_text or line - last_line > ECHO_LINES:
                yield line, pos - self.starts[line]
                last_text = raw
            last_line = line
            next_line = line + 1
            if next_line >= len(self.starts):
                return
            pos = text.find(needle, self.starts[next_line])

    def head(self, line: int, size: int = 500) -> str:
        """The start of a line, bounded, for cheap look-ups around an error."""
        if 0 <= line < len(self.lines):
            return self.lines[line][:size]
        return ""

    def lower_head(self, line: int, size: int = 500) -> str:
        """`head` of the lowercase copy."""
        if 0 <= line < len(self.lines):
            start = self.starts[line]
            return self.lower[start : start + min(size, len(self.lines[line]))]
        return ""

    def window(
        self,
        line: int,
        column: int = 0,
        *,
        max_lines: int = 16,
        max_chars: int = 6000,
        stop_at: tuple[str, ...] = (),
        blank_lines: int = 0,
    ) -> Window:
        """The message at (line, column) and the lines that continue it.

        Continuation stops at a line that starts a new record, after `max_lines` lines or
        `max_chars` characters, at a line holding one of the lowercase `stop_at` needles
        (the next message), or at a blank line (after `blank_lines` of them, for texts
        like XLA's that use blank separators).
        """
        raw = self.lines[line]
        if len(raw) > LONG_LINE:
            # Keep some text before the anchor for the exception name.
            raw = raw[max(0, column - 300) : column + max_chars]
        first = strip_prefix(raw)
        window = Window(line, [first + " " if raw[-1:].isspace() else first], last_line=line)
        size = len(window.parts[0])
        blanks = 0
        last = min(len(self.lines), line + max_lines)
        for index in range(line + 1, last):
            if stop_at:
                lowered = self.lower_head(index, max_chars)
                if any(needle in lowered for needle in stop_at):
                    break
            part = strip_prefix(self.lines[index][:max_chars])
            if part == "":
                blanks += 1
                if blanks > blank_lines:
                    break
                continue
            if starts_record(part) or size > max_chars:
                break
            # A wrap at a fixed width can fall next to a space: keep one.
            if self.lines[index][:1].isspace():
                part = " " + part
            if self.lines[index][-1:].isspace():
                part += " "
            blanks = 0
            window.parts.append(part)
            window.last_line = index
            size += len(part)
        return window
