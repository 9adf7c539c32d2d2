"""The processes on the shown device: pid, user, GPU memory, host RSS, command; ours first.

Processes that run under memdoc (`memdoc top`) add what their frameworks hold on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from memdoc.tui.palette import MUTED, OURS
from memdoc.tui.view import ProcessRow
from memdoc.tui.widgets.text import LinesWidget
from memdoc.units import format_bytes

PID = "PID"
USER = "USER"
GPU_MEM = "GPU MEM"
HOST_RSS = "HOST RSS"
FW_ALLOC = "FW ALLOC"
FW_RESERVED = "FW RESERVED"
# Cells, one space between columns included; the command takes the rest of the line.
WIDTHS = {PID: 8, USER: 9, GPU_MEM: 10, HOST_RSS: 10, FW_ALLOC: 10, FW_RESERVED: 12}
LEFT_ALIGNED = frozenset({PID, USER})
BASE_COLUMNS = (PID, USER, GPU_MEM, HOST_RSS)
FRAMEWORK_COLUMNS = (FW_ALLOC, FW_RESERVED)
# With the framework columns the line is long: these give way, in this order, to the command.
GIVE_WAY = (USER, HOST_RSS)
MIN_COMMAND_CELLS = 12
HEADER_STYLE = "bold reverse"


def columns_for(rows: Sequence[ProcessRow], width: int) -> dict[str, int]:
    """{title: width} of the columns to draw; the pid column fits the longest pid."""
    widths = {title: WIDTHS[title] for title in BASE_COLUMNS}
    widths[PID] = max([WIDTHS[PID], *(len(_pid_text(row)) + 1 for row in rows)])
    if not any(row.under_memdoc for row in rows):
        return widths
    widths |= {title: WIDTHS[title] for title in FRAMEWORK_COLUMNS}
    for title in GIVE_WAY:
        if width - sum(widths.values()) - 1 >= MIN_COMMAND_CELLS:
            break
        del widths[title]
    return widths


def header_line(columns: dict[str, int], width: int) -> Text:
    titles = "".join(_aligned(title, title, size) for title, size in columns.items())
    return Text((titles + " COMMAND").ljust(width)[:width], style=HEADER_STYLE)


def row_line(row: ProcessRow, columns: dict[str, int], width: int) -> Text:
    """One process; ours, and those under memdoc, marked with ● and in the run's colour."""
    cells = _cells(row)
    text = Text(no_wrap=True, overflow="ellipsis")
    for title, size in columns.items():
        value, style = cells[title]
        text.append(_aligned(title, value, size), style)
    text.append(" " + row.command, _style(row))
    text.truncate(width, overflow="ellipsis")
    return text


def _cells(row: ProcessRow) -> dict[str, tuple[str, str]]:
    style = _style(row)
    fw = row.under_memdoc  # blank where there is no trace to ask, '-' where it did not say
    return {
        PID: (_pid_text(row), style),
        USER: (row.user or "-", "" if row.user else MUTED),
        GPU_MEM: (format_bytes(row.gpu_bytes), style),
        HOST_RSS: (format_bytes(row.rss_bytes), ""),
        FW_ALLOC: (format_bytes(row.framework_allocated_bytes) if fw else "", style),
        FW_RESERVED: (format_bytes(row.framework_reserved_bytes) if fw else "", style),
    }


def _pid_text(row: ProcessRow) -> str:
    return f"{'●' if row.ours or row.under_memdoc else ' '} {row.pid}"


def _style(row: ProcessRow) -> str:
    return OURS if row.ours or row.under_memdoc else ""


def _aligned(title: str, value: str, size: int) -> str:
    cut = value[: size - 1]
    return (cut.ljust(size - 1) if title in LEFT_ALIGNED else cut.rjust(size - 1)) + " "


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
        columns = columns_for(self.rows, width)
        lines = [header_line(columns, width)]
        lines.extend(row_line(row, columns, width) for row in self.rows)
        if not self.rows:
            lines.append(Text(self.empty_text, style=MUTED))
        return lines
