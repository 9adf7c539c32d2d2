"""A text-only trace from an error text: the parsed OOM plus the traceback around it."""

from __future__ import annotations

from memdoc.oom.frames import TRACEBACK_START, read_traceback
from memdoc.oom.logtext import strip_prefix
from memdoc.trace.model import SCHEMA_VERSION, Event, EventKind, Header, OomInfo
from memdoc.trace.reader import Trace

# How far before the error to look for its traceback and for progress ("epoch 12").
LOOKBACK_LINES = 300
CONTEXT_MAX_CHARS = 20_000
# How many lines after the error may still be its own (hints that follow the message).
AFTER_LINES = 3


def text_trace(text: str, oom: OomInfo) -> Trace:
    """A trace in "text" mode holding the OOM, its traceback frames and the log before it."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    end = _error_line(lines, oom)
    start = max(0, end - LOOKBACK_LINES)
    stack, source = read_traceback(lines[start : end + 1])
    after = _continuation(lines, end)
    context = "\n".join(lines[start : after + 1])[-CONTEXT_MAX_CHARS:]
    trace = Trace(Header(version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="", mode="text"))
    trace.add_event(Event(t=0.0, kind=EventKind.OOM, data={"oom": oom.to_dict(), "stack": stack}))
    trace.add_event(
        Event(
            t=0.0,
            kind=EventKind.EXCEPTION,
            data={"message": context, "stack": stack, "source": source, "where": "text"},
        )
    )
    return trace


def _continuation(lines: list[str], end: int) -> int:
    """The last line that still belongs to the error: up to a few lines after it that carry
    on its text (a library's hint such as "try setting VLLM_..."), until a blank line or a
    new traceback."""
    last = end
    for index in range(end + 1, min(len(lines), end + 1 + AFTER_LINES)):
        line = strip_prefix(lines[index]).strip()
        if not line or line.startswith(TRACEBACK_START):
            break
        last = index
    return last


def _error_line(lines: list[str], oom: OomInfo) -> int:
    """0-based index of the last line of the error (the whole text when unknown)."""
    if oom.line is not None and 1 <= oom.line <= len(lines):
        return oom.line - 1 + oom.message.count("\n")
    return len(lines) - 1
