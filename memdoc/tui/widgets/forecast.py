"""The OOM forecast line: when, at the growth seen so far, memory reaches its limit."""

from __future__ import annotations

from textual.widgets import Static


class ForecastLine(Static):
    """One line, hidden while there is no forecast."""

    DEFAULT_CSS = """
    ForecastLine { display: none; height: 1; color: #ffd166; padding: 0 1; }
    ForecastLine.-visible { display: block; }
    """

    def show(self, words: str | None) -> None:
        self.set_class(words is not None, "-visible")
        if words is not None:
            self.update(words)
