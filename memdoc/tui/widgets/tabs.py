"""One line of device tabs, each with how full it is; the shown device stands out."""

from __future__ import annotations

from rich.text import Text

from memdoc.tui.palette import MUTED, fill_style
from memdoc.tui.view import DeviceTab
from memdoc.tui.widgets.text import LinesWidget
from memdoc.units import format_percent


def tabs_text(tabs: tuple[DeviceTab, ...], selected: int | None, width: int) -> Text:
    """Full names when they fit, else compact "0 45%" tabs (eight fit in 60 columns)."""
    if not tabs:
        return Text("no GPU in this view", style=MUTED)
    for compact in (False, True):
        text = Text.assemble(("GPU " if not compact else "", MUTED))
        for tab in tabs:
            percent = format_percent(tab.used_fraction)
            label = f"{tab.index}:{percent}" if compact else f" {tab.index} {tab.name} {percent} "
            style = fill_style(tab.used_fraction)
            text.append(label, style=f"reverse {style}" if tab.index == selected else style)
            text.append(" ")
        if text.cell_len <= width or compact:
            text.truncate(width)
            return text
    raise AssertionError("unreachable")  # pragma: no cover


class DeviceTabs(LinesWidget):
    DEFAULT_CSS = """
    DeviceTabs { height: 1; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._tabs: tuple[DeviceTab, ...] = ()
        self._selected: int | None = None

    def show(self, tabs: tuple[DeviceTab, ...], selected: int | None) -> None:
        if (tabs, selected) != (self._tabs, self._selected):
            self._tabs, self._selected = tabs, selected
            self.update_lines()

    def lines(self, width: int) -> list[Text]:
        return [tabs_text(self._tabs, self._selected, width)]
