"""The processes on the shown device: pid, user, GPU memory, host RSS, command; ours first."""

from __future__ import annotations

from rich.text import Text

from memdoc.tui.palette import MUTED, OURS
from memdoc.tui.view import ProcessRow
from memdoc.tui.widgets.text import LinesWidget
from memdoc.units import format_bytes

# (title, width, right-aligned); the command takes the rest of the line.
COLUMNS = (("PID", 8, False), ("USER", 9, False), ("GPU MEM", 10, True), ("HOST RSS", 10, True))
HEADER_STYLE = "bold reverse"


def header_line(width: int) -> Text:
    titles = "".join(
        (title.rjust(size - 1) if right else title.ljust(size - 1)) + " "
        for title, size, right in COLUMNS
    )
    return Text((titles + " COMMAND").ljust(width)[:width], style=HEADER_STYLE)


def row_line(row: ProcessRow, width: int) -> Text:
    """One process; ours marked with ● and in the run's colour."""
    style = OURS if row.ours else ""
    cells = (
        (f"{'●' if row.ours else ' '} {row.pid}", style),
        (row.user or "-", "" if row.user else MUTED),
        (format_bytes(row.gpu_bytes), style),
        (format_bytes(row.rss_bytes), ""),
    )
    text = Text(no_wrap=True, overflow="ellipsis")
    for (value, cell_style), (_, size, right) in zip(cells, COLUMNS, strict=True):
        cut = value[: size - 1]
        text.append((cut.rjust(size - 1) if right else cut.ljust(size - 1)) + " ", cell_style)
    text.append(" " + row.command, style)
    text.truncate(width, overflow="ellipsis")
    return text


class ProcessTable(LinesWidget):
    """A plain table (a DataTable costs too much to rebuild several times a second)."""

    DEFAULT_CSS = """
    ProcessTable { height: 1fr; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: tuple[ProcessRow, ...] = ()
        self.empty_text = "no process seen on this device yet"

    def show(self, rows: tuple[ProcessRow, ...], empty_text: str | None = None) -> None:
        empty_text = empty_text or self.empty_text
        if (rows, empty_text) != (self.rows, self.empty_text):
            self.rows, self.empty_text = rows, empty_text
            self.update_lines()

    def lines(self, width: int) -> list[Text]:
        lines = [header_line(width)]
        lines.extend(row_line(row, width) for row in self.rows)
        if not self.rows:
            lines.append(Text(self.empty_text, style=MUTED))
        return lines
