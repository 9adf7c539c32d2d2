"""Regular expressions compiled the first time they are used, not when their module loads.

The recogniser holds a few hundred patterns. Compiled at import they cost every `memdoc`
command and every recorded run some 60 ms of start, though most texts it reads (a program's
output that holds no memory error) reach only a few of them: the parsers look for their
anchor words first.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any


class Pattern:
    """A regular expression, compiled on first use; it answers as `re.Pattern` does for the
    methods the recogniser calls."""

    __slots__ = ("_compiled", "flags", "source")

    def __init__(self, source: str, flags: int = 0) -> None:
        self.source = source
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        # Two threads may both compile it the first time: the same pattern either way.
        if self._compiled is None:
            self._compiled = re.compile(self.source, self.flags)
        return self._compiled

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.search(string, pos, endpos)

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.match(string, pos, endpos)

    def fullmatch(
        self, string: str, pos: int = 0, endpos: int = sys.maxsize
    ) -> re.Match[str] | None:
        return self.compiled.fullmatch(string, pos, endpos)

    def finditer(
        self, string: str, pos: int = 0, endpos: int = sys.maxsize
    ) -> Iterator[re.Match[str]]:
        return self.compiled.finditer(string, pos, endpos)

    def findall(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> list[Any]:
        return self.compiled.findall(string, pos, endpos)

    def split(self, string: str, maxsplit: int = 0) -> list[str | Any]:
        return self.compiled.split(string, maxsplit)

    def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str:
        return self.compiled.sub(repl, string, count)

    def __repr__(self) -> str:
        return f"Pattern({self.source!r}, {self.flags!r})"


def compile_later(source: str, flags: int = 0) -> Pattern:
    """`re.compile(source, flags)`, done when the pattern is first used."""
    return Pattern(source, flags)
