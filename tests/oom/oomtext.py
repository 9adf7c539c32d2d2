"""Read the OOM message fixtures the way the tests cite them: by section, by quote, by id."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MESSAGES = FIXTURES / "oom-messages"
CATALOGUE = "catalogue.md"
FORMATS = "formats-by-version.md"


def gib(value: float) -> int:
    return round(value * 1024**3)


def mib(value: float) -> int:
    return round(value * 1024**2)


def kib(value: float) -> int:
    return round(value * 1024)


@cache
def text_of(name: str) -> str:
    return (MESSAGES / name).read_text(encoding="utf-8")


@cache
def fenced_blocks(name: str) -> tuple[tuple[str, str], ...]:
    """(heading, text) of every ``` block of a fixture, in order."""
    blocks: list[tuple[str, str]] = []
    heading = ""
    lines = text_of(name).split("\n")
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = line
        if line.lstrip().startswith("```"):
            body = []
            index += 1
            while index < len(lines) and not lines[index].lstrip().startswith("```"):
                body.append(lines[index])
                index += 1
            blocks.append((heading, "\n".join(body)))
        index += 1
    return tuple(blocks)


def fenced(name: str, heading: str, index: int = 0) -> str:
    """The `index`-th ``` block under the heading that starts with `heading`."""
    found = [text for head, text in fenced_blocks(name) if head.startswith(heading)]
    assert len(found) > index, f"{name}: no block {index} under {heading!r}"
    return found[index]


def quoted(name: str, needle: str) -> str:
    """The `inline code` span of a fixture that contains `needle` (first one)."""
    for match in re.finditer(r"``\s?(.+?)\s?``|`([^`\n]+)`", text_of(name)):
        span = match.group(1) or match.group(2)
        if needle in span:
            return span.strip()
    raise AssertionError(f"{name}: no quoted text contains {needle!r}")


def quoted_lines(name: str, needle: str) -> str:
    """Consecutive `a` / `b` spans on one bullet line, as the lines they quote."""
    for line in text_of(name).split("\n"):
        if needle in line:
            return "\n".join(span.strip() for span in re.findall(r"`([^`]+)`", line))
    raise AssertionError(f"{name}: no line contains {needle!r}")


def phrase(name: str, text: str) -> str:
    """`text`, after checking that the fixture holds it verbatim."""
    assert text in text_of(name), f"{name} does not contain {text!r}"
    return text


@cache
def jsonl(name: str) -> tuple[dict[str, str], ...]:
    path = FIXTURES / name
    return tuple(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())
