"""The top lines: what is shown, where in time, and anything the person must know."""

from __future__ import annotations

from rich.text import Text

from memdoc.tui.palette import ERROR, MUTED, WARNING
from memdoc.tui.sources import KIND_FOLLOW, KIND_REPLAY
from memdoc.tui.view import StatusView
from memdoc.tui.widgets.chart import format_trace_time
from memdoc.tui.widgets.text import LinesWidget, clipped

# A writer flushes at least every 0.5 s: silence much longer than that is worth saying.
STALE_AFTER_S = 5.0


def mode_text(status: StatusView) -> Text:
    if status.kind == KIND_REPLAY:
        state = "‖ paused" if status.paused else "▶ replay"
        return Text.assemble((f"{state} {status.speed or 1:g}x", "bold"))
    if status.paused:
        return Text.assemble(("‖ paused", "bold"))
    if status.kind == KIND_FOLLOW and status.ended:
        return Text.assemble(("■ ended, not closed: its writer is gone", "bold"))
    if status.kind == KIND_FOLLOW and not status.live:
        return Text.assemble(("■ finished", "bold"))
    return Text.assemble(("● live", "bold #3fb950"))


def title_line(status: StatusView) -> Text:
    text = Text.assemble(("memdoc ", "bold"))
    text.append({"follow": "live", "replay": "replay", "system": "top"}.get(status.kind, ""))
    text.append(f"  {status.label}", style="bold")
    if status.command:
        text.append(f"  {status.command}", style=MUTED)
    return text


def time_line(status: StatusView) -> Text:
    text = mode_text(status)
    where = f"  t {format_trace_time(status.now_t)}"
    if status.end_t is not None:
        where += f" / {format_trace_time(status.end_t)}"
    text.append(where)
    if status.exit_text:
        text.append(f"  {status.exit_text}", style="bold")
    if status.step is not None:
        text.append(f"  step {status.step}")
    if status.phase:
        text.append(f"  phase {status.phase}")
    if status.age_s is not None and status.age_s > STALE_AFTER_S:
        said = "last data" if status.ended else "no new data for"
        age = format_trace_time(status.age_s)
        text.append(f"  {said} {age}{' ago' if status.ended else ''}", style=WARNING)
    if status.damaged_lines:
        text.append(f"  {status.damaged_lines} damaged line(s) skipped", style=WARNING)
    return text


def header_lines(status: StatusView, width: int) -> list[Text]:
    """Two clipped lines (title, time), then notes and errors, which wrap: they matter."""
    lines = [clipped(title_line(status), width), clipped(time_line(status), width)]
    for note in status.notes:
        lines.append(Text(note, style=WARNING))
    if status.error:
        lines.append(Text(status.error, style=ERROR))
    return lines


class RunHeader(LinesWidget):
    DEFAULT_CSS = """
    RunHeader { height: auto; padding: 0 1; background: $panel; }
    """
    wrap = True  # notes and errors wrap: they matter; the first two lines are clipped

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._status: StatusView | None = None

    def show(self, status: StatusView) -> None:
        if status != self._status:
            self._status = status
            self.update_lines()

    def lines(self, width: int) -> list[Text]:
        if self._status is None:
            return [Text("memdoc", style="bold")]
        return header_lines(self._status, width)
