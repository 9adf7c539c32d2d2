"""Standard streams that cannot encode every character (PYTHONIOENCODING=ascii, a latin-1
locale): what memdoc prints degrades to look-alikes, then to `?`, instead of failing."""

from __future__ import annotations

import codecs
import io
import sys

ERRORS = "memdoc-degrade"
# Characters memdoc's own texts use, and what they become where they cannot be written.
_LOOK_ALIKES = {
    "·": "-",
    "•": "*",
    "–": "-",
    "—": "--",
    "…": "...",
    "×": "x",
    "→": "->",
    "←": "<-",
    "≥": ">=",
    "≤": "<=",
    "≈": "~",
    "±": "+/-",
    "µ": "u",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
    "─": "-",
    "━": "-",
    "│": "|",
    "┃": "|",
    "✓": "v",
    "✗": "x",
    "▲": "^",
    "▼": "v",
    "█": "#",
    "░": ".",
    "\u00a0": " ",
}


def _degrade(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start : error.end]
    return "".join(_look_alike(ch, error.encoding) for ch in bad), error.end


def _look_alike(ch: str, encoding: str) -> str:
    other = _LOOK_ALIKES.get(ch, "?")
    try:
        other.encode(encoding)
    except UnicodeError:
        return "?"
    return other


def degrade_standard_streams() -> None:
    """Make stdout and stderr write look-alikes (`-` for `·`, `...` for `…`) or `?` for
    what their encoding cannot hold, where they would raise. UTF-8 streams are unchanged."""
    try:
        codecs.lookup_error(ERRORS)
    except LookupError:
        codecs.register_error(ERRORS, _degrade)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            try:
                stream.reconfigure(errors=ERRORS)
            except (ValueError, OSError):
                continue  # a closed or detached stream: nothing will be written to it
