"""Text from outside memdoc made safe to show: no terminal control, no undecodable bytes."""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the bidirectional overrides that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEPING_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Lone surrogates: bytes that were not UTF-8 (surrogateescape) or a damaged string.
_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, *, keep_lines: bool = False) -> str:
    """`text` as it may reach a terminal or a widget: control characters shown as escapes
    (ESC as the four characters `\\x1b`), lone surrogates as U+FFFD.

    `keep_lines` keeps newlines and tabs, for multi-line texts such as an error message.
    """
    unsafe = _UNSAFE_KEEPING_LINES if keep_lines else _UNSAFE
    return _SURROGATE.sub(REPLACEMENT, unsafe.sub(_escaped, text))
