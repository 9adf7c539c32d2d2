"""The ledger bar: one device (or the host) as allocated / cached / other / others / free."""

from __future__ import annotations

from rich.text import Text

from memdoc.tui.ledger import DeviceBar, HostLedger, Segment
from memdoc.tui.palette import MUTED, SEGMENT_STYLES, fill_style
from memdoc.tui.widgets.text import LinesWidget, pack
from memdoc.units import format_bytes, format_percent

BAR_CELL = "█"
# Narrow terminals: the title goes and the legend uses these.
COMPACT_WIDTH = 80
SHORT_LABELS = {
    "allocated": "alloc",
    "cached free": "cached",
    "other (this run)": "run other",
    "other processes": "others",
    "this run (RSS)": "run RSS",
    "other used": "others",
    "rest of the cgroup": "others",
    "mapped, not resident": "mapped",
    "left under the limit": "left",
    "pool (split unknown)": "pool",
}
# Free and the unexplained remainder are shaded, not solid: nothing measured fills them.
SEGMENT_CELLS = {"free": "░", "unexplained": "▒"}


def bar_cells(segments: list[Segment], capacity_bytes: int | None, width: int) -> list[int]:
    """Cells per segment: proportional, summing to `width`, a visible sliver kept visible.

    Unknown segments get no cells; the free segment takes whatever rounding leaves.
    """
    sizes = [max(0, s.size_bytes or 0) for s in segments]
    total = capacity_bytes or sum(sizes)
    if width <= 0 or total <= 0:
        return [0] * len(segments)
    cells = [round(size / total * width) for size in sizes]
    for i, size in enumerate(sizes):
        if size and not cells[i] and size / total >= 0.002:
            cells[i] = 1
    excess = sum(cells) - width
    order = sorted(range(len(cells)), key=lambda i: -cells[i])
    for i in order:
        if excess <= 0:
            break
        take = min(excess, cells[i] - 1 if cells[i] > 1 else 0)
        cells[i] -= take
        excess -= take
    if segments and segments[-1].key == "free":
        cells[-1] += width - sum(cells)
    return cells


def ledger_title(ledger: DeviceBar | HostLedger, name: str) -> Text:
    text = Text.assemble((name, "bold"))
    capacity = ledger.capacity_bytes
    if capacity:
        text.append(f"  {format_bytes(capacity)}", style=MUTED)
    if isinstance(ledger, DeviceBar):
        fraction = ledger.used_fraction
        if fraction is not None:
            text.append(f"  {format_percent(fraction)} used", style=fill_style(fraction))
    else:
        text.append(f" {ledger.limit_name}", style=MUTED)
    return text


def legend_lines(segments: list[Segment], width: int, *, short: bool = False) -> list[Text]:
    """'■ label size' items, packed into as few lines as fit `width`."""
    items = []
    for segment in segments:
        item = Text()
        item.append("■ ", style=SEGMENT_STYLES.get(segment.key, ""))
        label = SHORT_LABELS.get(segment.label, segment.label) if short else segment.label
        item.append(f"{label} ")
        item.append(format_bytes(segment.size_bytes), style="bold")
        items.append(item)
    return pack(items, width)


class LedgerBar(LinesWidget):
    """Title, the bar, and a legend with every segment's size in human units."""

    DEFAULT_CSS = """
    LedgerBar { height: auto; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._ledger: DeviceBar | HostLedger | None = None
        self._title = ""

    def show(self, ledger: DeviceBar | HostLedger | None, name: str) -> None:
        if (ledger, name) != (self._ledger, self._title):
            self._ledger, self._title = ledger, name
            self.update_lines()

    def lines(self, width: int) -> list[Text]:
        ledger = self._ledger
        if ledger is None:
            return [Text("no memory recorded yet", style=MUTED)]
        segments = ledger.segments()
        bar = Text()
        for segment, cells in zip(
            segments, bar_cells(segments, ledger.capacity_bytes, width), strict=True
        ):
            cell = SEGMENT_CELLS.get(segment.key, BAR_CELL)
            bar.append(cell * cells, style=SEGMENT_STYLES.get(segment.key, ""))
        if width < COMPACT_WIDTH:
            return [bar, *legend_lines(segments, width, short=True)]
        return [ledger_title(ledger, self._title), bar, *legend_lines(segments, width)]
