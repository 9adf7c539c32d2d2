"""The history chart: the level over the pool, the interval-peak envelope, and event ticks."""

from __future__ import annotations

import math
from collections.abc import Iterable

from rich.segment import Segment
from rich.style import Style
from textual.events import Resize
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from memdoc.tui.history import TICK_MARK, TICK_OOM, TICK_STEP, ChartData
from memdoc.tui.palette import LIMIT, MARK, MUTED, OOM, PEAK, RESERVED_BG, SEGMENT_STYLES, STEP
from memdoc.units import format_bytes

AXIS_WIDTH = 10  # "140.0 GiB" and the axis line
_EIGHTHS = " ▁▂▃▄▅▆▇█"
_TICKS = {TICK_STEP: ("╵", STEP), TICK_MARK: ("◆", MARK), TICK_OOM: ("✖", OOM)}
_LEVEL_STYLES = {
    "allocated": SEGMENT_STYLES["allocated"],
    "host RSS": SEGMENT_STYLES["ours_rss"],
}
_OTHER_LEVEL_STYLE = "#58a6ff"
_BAND_ONLY = f"on {RESERVED_BG}"
_PEAK_ON_BAND = f"{PEAK} on {RESERVED_BG}"


def plot_columns(width: int) -> int:
    """How many time columns a chart of `width` cells draws."""
    return max(1, width - AXIS_WIDTH)


Run = tuple[str, str]  # text and its style: a line is a list of runs


class ColumnCache:
    """Drawn columns by their values: on a fixed time grid most columns recur frame after
    frame, so only the new ones are drawn. Forgets everything when the scale changes."""

    MAX_COLUMNS = 4096

    def __init__(self) -> None:
        self._shape: tuple[object, ...] | None = None
        self._columns: dict[tuple[float | None, ...], list[Run]] = {}

    def columns(self, chart: ChartData, rows: int) -> list[list[Run]]:
        unit = chart.scale_bytes / rows
        style = _LEVEL_STYLES.get(chart.level_label, _OTHER_LEVEL_STYLE)
        shape = (rows, unit, style, chart.limit_bytes)
        if shape != self._shape or len(self._columns) > self.MAX_COLUMNS:
            self._shape, self._columns = shape, {}
        out = []
        for c in range(len(chart.level)):
            key = (chart.level[c], chart.band[c], chart.peak[c])
            column = self._columns.get(key)
            if column is None:
                column = self._columns[key] = _column_cells(chart, c, rows, unit, style)
            out.append(column)
        return out


def render_chart(
    chart: ChartData,
    width: int,
    height: int,
    window_label: str,
    cache: ColumnCache | None = None,
) -> list[list[Run]]:
    """The chart as lines of styled runs: legend, plot rows, ticks and a time axis.

    Short charts drop the legend first, so that the plot keeps three rows.
    """
    legend = height >= 7
    rows = max(1, height - (3 if legend else 2))
    lines = [_legend(chart, width, window_label)] if legend else []
    lines.extend(_plot_rows(chart, rows, cache or ColumnCache()))
    lines.append(_tick_row(chart))
    lines.append([(_time_axis(chart, width), MUTED)])
    return lines


def _legend(chart: ChartData, width: int, window_label: str) -> list[Run]:
    runs: list[Run] = [("█ ", _LEVEL_STYLES.get(chart.level_label, _OTHER_LEVEL_STYLE))]
    runs.append((chart.level_label, ""))
    if chart.band_label:
        runs += [("  ", ""), ("  ", f"on {RESERVED_BG}"), (f" {chart.band_label}", "")]
    runs += [("  ─ ", PEAK), ("peak", "")]
    if chart.limit_bytes is not None and chart.limit_bytes <= chart.scale_bytes * 1.000001:
        runs += [("  ┄ ", LIMIT), ("capacity", "")]
    for glyph, style, label in (("╵", STEP, "step"), ("◆", MARK, "mark"), ("✖", OOM, "OOM")):
        runs += [(f"  {glyph} ", style), (label, "")]
    used = sum(len(text) for text, _ in runs)
    gap = width - used - len(window_label)
    if gap >= 2:
        runs += [(" " * gap, ""), (window_label, MUTED)]
    return runs


def _plot_rows(chart: ChartData, rows: int, cache: ColumnCache) -> list[list[Run]]:
    grid = cache.columns(chart, rows)
    labels = {rows - 1: chart.scale_bytes, (rows - 1) // 2: chart.scale_bytes / 2}
    out: list[list[Run]] = []
    for row in range(rows - 1, -1, -1):
        label = labels.get(row)
        axis = (format_bytes(label, 0) if label is not None and rows > 1 else "").rjust(9)
        line: list[Run] = [(axis + ("┤" if label is not None else "│"), MUTED)]
        line.extend(_coalesce(column[row] for column in grid))
        out.append(line)
    return out


def _column_cells(chart: ChartData, c: int, rows: int, unit: float, level_style: str) -> list[Run]:
    """One column, bottom row first: the level in eighths, the pool behind it, the peak and
    the capacity above it. Computed per column, not per cell: this runs for every frame."""
    level = chart.level[c] or 0.0
    band = chart.band[c] or 0.0
    peak = chart.peak[c] or 0.0
    full = min(rows, int(level / unit))
    eighth = int((level / unit - full) * 8) if full < rows else 0
    band_rows = min(rows, math.ceil(band / unit)) if band > 0 else 0
    peak_row = int(peak / unit) if peak > level else -1
    limit_row = _limit_row(chart, rows, unit)
    on_band = f"{level_style} on {RESERVED_BG}"
    cells: list[Run] = []
    for row in range(rows):
        behind = row < band_rows
        if row < full or (row == full and eighth):
            glyph = "█" if row < full else _EIGHTHS[eighth]
            cells.append((glyph, on_band if behind else level_style))
        elif row == peak_row:
            cells.append(("─", _PEAK_ON_BAND if behind else PEAK))
        elif row == limit_row:
            cells.append(("┄", LIMIT))
        else:
            cells.append((" ", _BAND_ONLY if behind else ""))
    return cells


def _limit_row(chart: ChartData, rows: int, unit: float) -> int:
    """The row of the capacity line: the top row when the chart is scaled to the capacity."""
    limit = chart.limit_bytes
    if limit is None or limit > chart.scale_bytes * 1.000001:
        return -1
    return min(rows - 1, int(limit / unit))


def _coalesce(cells: Iterable[Run]) -> list[Run]:
    """Neighbouring cells of one style as one run: far fewer segments to draw."""
    runs: list[Run] = []
    glyphs: list[str] = []
    current: str | None = None
    for glyph, style in cells:
        if style != current and glyphs:
            runs.append(("".join(glyphs), current or ""))
            glyphs = []
        current = style
        glyphs.append(glyph)
    if glyphs:
        runs.append(("".join(glyphs), current or ""))
    return runs


def _tick_row(chart: ChartData) -> list[Run]:
    line: list[Run] = [(" " * 9 + "╰", MUTED)]
    line.extend(_coalesce(_TICKS.get(tick, ("─", MUTED)) for tick in chart.ticks))
    return line


def _time_axis(chart: ChartData, width: int) -> str:
    window = chart.window
    columns = len(chart.level)
    mid_t = (window.t0_s + window.t1_s) / 2
    cells = [" "] * max(0, width)
    for position, t, anchor in (
        (AXIS_WIDTH, window.t0_s, "left"),
        (AXIS_WIDTH + columns // 2, mid_t, "centre"),
        (AXIS_WIDTH + columns, window.last_s, "right"),
    ):
        if t < 0:
            continue
        label = format_trace_time(t)
        start = {"left": position, "centre": position - len(label) // 2}.get(
            anchor, position - len(label)
        )
        for i, ch in enumerate(label):
            if 0 <= start + i < len(cells):
                cells[start + i] = ch
    return "".join(cells)


def chart_text(lines: list[list[Run]]) -> str:
    """The chart's characters without styles (what a person reads; tests use it)."""
    return "\n".join("".join(text for text, _ in line) for line in lines)


def format_trace_time(t_s: float) -> str:
    """Seconds since the trace started: 12.3s, 4m05s, 1h02m."""
    if t_s < 60:
        return f"{t_s:.1f}s"
    minutes, seconds = divmod(int(t_s), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class HistoryChart(Widget):
    """Draws the last ChartData it was given, at whatever size it has (Textual's line API:
    the strips are built once per frame and served line by line)."""

    DEFAULT_CSS = """
    HistoryChart { height: 1fr; min-height: 6; padding: 0 1; }
    """

    class Resized(Message):
        """The chart's width changed: frames should now carry this many columns."""

        def __init__(self, columns: int) -> None:
            super().__init__()
            self.columns = columns

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._chart: ChartData | None = None
        self._window_label = ""
        self._strips: list[Strip] = []
        self._strips_size: Size | None = None
        self._cache = ColumnCache()

    @property
    def columns(self) -> int:
        return plot_columns(self.content_size.width)

    def show(self, chart: ChartData | None, window_label: str) -> None:
        if chart == self._chart and window_label == self._window_label:
            return
        self._chart, self._window_label = chart, window_label
        self._strips_size = None
        self.refresh()

    def on_resize(self, event: Resize) -> None:
        self._strips_size = None
        self.post_message(self.Resized(self.columns))

    def render_line(self, y: int) -> Strip:
        size = self.content_size
        if self._strips_size != size:
            self._strips = self._build_strips(size)
            self._strips_size = size
        if 0 <= y < len(self._strips):
            return self._strips[y]
        return Strip.blank(size.width, self.rich_style)

    def _build_strips(self, size: Size) -> list[Strip]:
        if self._chart is None:
            lines: list[list[Run]] = [[("waiting for samples…", MUTED)]]
        else:
            lines = render_chart(
                self._chart, size.width, size.height, self._window_label, self._cache
            )
        base = self.rich_style
        # Until a frame with the new width arrives, lines are cut, never wrapped.
        return [
            Strip([Segment(text, base + Style.parse(style)) for text, style in line])
            .adjust_cell_length(size.width, base)
            .simplify()
            for line in lines
        ]
