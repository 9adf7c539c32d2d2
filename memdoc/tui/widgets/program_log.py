"""The wrapped program's last output lines, while the dashboard holds the terminal."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from memdoc.tui.palette import MUTED
from memdoc.tui.widgets.text import shown


class ProgramLog(Widget):
    DEFAULT_CSS = """
    ProgramLog { height: 6; min-height: 6; padding: 0 1; border-top: solid $panel-lighten-2; }
    """

    def __init__(self, log_name: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._log_name = log_name
        self._lines: tuple[str, ...] = ()

    def show(self, lines: tuple[str, ...]) -> None:
        if lines != self._lines:
            self._lines = lines
            self.refresh()

    def render(self) -> Text:
        height = max(1, self.content_size.height)
        text = Text.assemble((f"program output ({self._log_name})", MUTED))
        for line in self._lines[-(height - 1) :] if height > 1 else ():
            text.append("\n")
            text.append(line)
        text.no_wrap, text.overflow = True, "ellipsis"
        return shown(text)
