"""The programs running under memdoc on this machine (`memdoc top`): pid, command, RSS, trace."""

from __future__ import annotations

from rich.text import Text

from memdoc.tui.palette import MUTED, OURS
from memdoc.tui.under_memdoc import RecordingRow
from memdoc.tui.widgets.text import LinesWidget, clipped
from memdoc.units import format_bytes, format_duration

MAX_SHOWN = 4
TITLE = "Under memdoc"


def recording_lines(rows: tuple[RecordingRow, ...], width: int) -> list[Text]:
    """Two lines per recording: who it is, then what it holds and where its trace goes."""
    title = Text(TITLE, style="bold")
    if not rows:
        return [title.append("  none running", style=MUTED)]
    lines = [title.append(f"  {len(rows)} running", style=MUTED)]
    for row in rows[:MAX_SHOWN]:
        lines.append(clipped(Text.assemble((f"● {row.pid}", OURS), "  ", row.command), width))
        facts = f"  RSS {format_bytes(row.rss_bytes)} · running {format_duration(row.running_s)} · "
        path = _left_clipped(str(row.trace_path), width - len(facts))
        lines.append(Text.assemble(facts, (path, MUTED)))
    if len(rows) > MAX_SHOWN:
        lines.append(Text(f"and {len(rows) - MAX_SHOWN} more", style=MUTED))
    return lines


def _left_clipped(text: str, width: int) -> str:
    """The end of a path is the part that tells files apart: cut the start."""
    if len(text) <= width:
        return text
    return "…" + text[len(text) - max(width, 2) + 1 :]


class RecordingsPanel(LinesWidget):
    DEFAULT_CSS = """
    RecordingsPanel { height: auto; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._rows: tuple[RecordingRow, ...] = ()

    def show(self, rows: tuple[RecordingRow, ...]) -> None:
        if rows != self._rows:
            self._rows = rows
            self.update_lines()

    def lines(self, width: int) -> list[Text]:
        return recording_lines(self._rows, width)
