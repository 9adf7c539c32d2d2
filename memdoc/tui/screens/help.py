"""The help screen: every key binding, and what the colours of the ledger and chart mean."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from memdoc.tui.palette import LIMIT, PEAK, RESERVED_BG, SEGMENT_STYLES, STEP

LEGEND = (
    ("■", SEGMENT_STYLES["allocated"], "allocated: live tensors/buffers of the framework"),
    ("■", SEGMENT_STYLES["cached"], "cached free: held by the framework's pool, not in use"),
    (
        "■",
        SEGMENT_STYLES["ours_other"],
        "other (this run): CUDA contexts, library workspaces, the rest",
    ),
    ("■", SEGMENT_STYLES["others"], "other processes (every process, in the system view)"),
    ("▒", SEGMENT_STYLES["unexplained"], "unexplained: used, but by nothing that was measured"),
    ("░", SEGMENT_STYLES["free"], "free on the device"),
    ("  ", f"on {RESERVED_BG}", "chart: the framework pool (reserved) behind allocated"),
    ("─", PEAK, "chart: interval peak, a spike between two samples"),
    ("┄", LIMIT, "chart: the device's capacity"),
    ("╵", STEP, "step    ◆ mark (phase)    ✖ out of memory"),
)


def bindings_table(rows: Iterable[tuple[str, str, bool]]) -> Table:
    """(keys, what they do, usable here) as a two-column table."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for keys, description, usable in rows:
        table.add_row(keys, Text(description, style="" if usable else "dim"))
    return table


def legend_text() -> Text:
    text = Text()
    for glyph, style, meaning in LEGEND:
        if text:
            text.append("\n")
        text.append(glyph, style=style)
        text.append(f" {meaning}")
    return text


class HelpScreen(ModalScreen[None]):
    """Lists the bindings it is given; any of escape, ? or q closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 90; height: 90%; padding: 1 2;
        background: $panel; border: round $accent;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "Close help"),
    ]

    def __init__(self, rows: list[tuple[str, str, bool]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("Keys", style="bold"))
            yield Static(bindings_table(self.rows), id="help-bindings")
            yield Static(Text("\nColours", style="bold"))
            yield Static(legend_text())
            yield Static(Text("\n(dimmed keys do nothing in this view)   escape, ? or q: close"))

    def action_close(self) -> None:
        self.dismiss(None)
