"""The messages the dashboard's worker posts to the app: typed, immutable, display-ready."""

from __future__ import annotations

from pathlib import Path

from textual.message import Message

from memdoc.rules.base import Finding
from memdoc.tui.view import DashboardView


class ViewUpdated(Message):
    """A new frame to display."""

    def __init__(self, view: DashboardView) -> None:
        super().__init__()
        self.view = view


class FindingsUpdated(Message):
    """The rules ran again on what has been shown so far; findings by falling confidence."""

    def __init__(self, findings: tuple[Finding, ...], error: str | None = None) -> None:
        super().__init__()
        self.findings = findings
        self.error = error


class ProgramOutput(Message):
    """The last lines the wrapped program wrote to its log."""

    def __init__(self, lines: tuple[str, ...]) -> None:
        super().__init__()
        self.lines = lines


class ReportFinished(Message):
    """`memdoc report` finished: the HTML file, or why there is none."""

    def __init__(self, path: Path | None, error: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.error = error
