"""Laying out short items of text: made printable, packed into as few lines as a width allows."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from memdoc.printable import printable

SEPARATOR = "  "


def shown(text: Text) -> Text:
    """`text` with its styles, every character of it printable: a command line, a device
    name or a log line that holds an escape sequence is shown, never obeyed by the terminal.

    Text objects are never parsed as markup, so `[bold]` in a trace stays as written.
    """
    plain = text.plain
    if printable(plain, keep_lines=True) == plain:
        return text
    edges = sorted({0, len(plain), *(e for span in text.spans for e in (span.start, span.end))})
    result = Text(
        style=text.style,
        justify=text.justify,
        overflow=text.overflow,
        no_wrap=text.no_wrap,
        end=text.end,
    )
    for piece in text.divide(edges[1:-1]):
        part = Text(printable(piece.plain, keep_lines=True))
        for span in piece.spans:  # each covers the whole piece: the edges cut at every span
            if span.end > span.start:
                part.stylize(span.style)
        result.append_text(part)
    return result


def pack(items: Iterable[Text], width: int, separator: str = SEPARATOR) -> list[Text]:
    """Items kept whole, each line filled while the next item still fits."""
    lines: list[Text] = []
    line = Text()
    for item in items:
        if line.cell_len and line.cell_len + len(separator) + item.cell_len > width:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(separator)
        line.append_text(item)
    if line.cell_len:
        lines.append(line)
    return lines


def clipped(line: Text, width: int) -> Text:
    """One line, cut with an ellipsis where it does not fit."""
    line = line.copy()
    line.no_wrap = True
    line.truncate(max(1, width), overflow="ellipsis")
    return line


class LinesWidget(Widget):
    """A widget drawn as lines of text that redraws only when those lines change.

    Frames arrive four times a second and most change numbers nobody could see change
    (bytes below the shown precision): comparing the text is cheaper than drawing it.
    Subclasses implement `lines(width)` and call `update_lines()` when their data changes.
    """

    wrap = False  # True: long lines wrap (notes); False: they are cut with an ellipsis

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: list[Text] | None = None
        self._shown_width = -1

    def lines(self, width: int) -> list[Text]:
        raise NotImplementedError

    def _printable_lines(self, width: int) -> list[Text]:
        return [shown(line) for line in self.lines(width)]

    def update_lines(self) -> None:
        width = self.content_size.width
        lines = self._printable_lines(width)
        if lines == self._shown and width == self._shown_width:
            return
        resized = self._shown is None or self._height(lines, width) != self._height(
            self._shown, width
        )
        self._shown, self._shown_width = lines, width
        self.refresh(layout=resized)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self._height(self._lines_for(width), width)

    def render(self) -> Text:
        width = self.content_size.width
        joined = Text("\n").join(self._lines_for(width))
        if not self.wrap:
            joined.no_wrap, joined.overflow = True, "ellipsis"
        return joined

    def _lines_for(self, width: int) -> list[Text]:
        if self._shown is None or width != self._shown_width:
            self._shown, self._shown_width = self._printable_lines(width), width
        return self._shown

    def _height(self, lines: list[Text], width: int) -> int:
        if not self.wrap:
            return len(lines)
        return sum(len(line.wrap(self.app.console, max(1, width))) for line in lines)
