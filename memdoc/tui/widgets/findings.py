"""The findings panel: each root cause the rules see, its confidence, evidence and top fix."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from memdoc.rules.base import Finding, Fix
from memdoc.tui.palette import ERROR, MUTED, fill_style
from memdoc.tui.widgets.text import shown
from memdoc.units import format_percent

MAX_EVIDENCE = 2


CODE_STYLE = "bold #79c0ff"
# Lines that set the scene rather than say what to do: the first other line is shown.
_PREAMBLE = ("import ", "from ", "#")


def first_line(code: str) -> str:
    """The line of a fix's code that says what to do."""
    lines = [line.strip() for line in code.splitlines() if line.strip()]
    for line in lines:
        if not line.startswith(_PREAMBLE):
            return line
    return lines[0] if lines else ""


def fix_text(fix: Fix, indent: str = "  ") -> Text:
    """The fix's title, and its code on a line of its own (so that it can be copied)."""
    text = Text.assemble(("fix: ", "bold"), fix.title)
    code = first_line(fix.code)
    if code:
        text.append(f"\n{indent}  ")
        text.append(code, style=CODE_STYLE)
    return text


def findings_text(findings: tuple[Finding, ...] | None, error: str | None) -> Text:
    text = Text.assemble(("Findings", "bold"))
    if error:
        text.append(f"\n{error}", style=ERROR)
    if findings is None:
        text.append("\nthe rules run every few seconds on what has been shown", style=MUTED)
        return text
    if not findings:
        text.append("\nnothing points at a memory problem so far", style=MUTED)
        return text
    for finding in findings:
        text.append("\n● ", style=fill_style(finding.confidence))
        text.append(f"{format_percent(finding.confidence)} ", style=fill_style(finding.confidence))
        text.append(finding.title, style="bold")
        text.append(f"  {finding.rule}", style=MUTED)
        if finding.summary:
            text.append(f"\n  {finding.summary}")
        for evidence in finding.evidence[:MAX_EVIDENCE]:
            text.append(f"\n  · {evidence.text}", style=MUTED)
        if finding.fixes:
            text.append("\n  ")
            text.append_text(fix_text(finding.fixes[0]))
    return text


class FindingsPanel(VerticalScroll):
    """Scrolls when the findings do not fit."""

    DEFAULT_CSS = """
    FindingsPanel { height: 1fr; padding: 0 1; }
    FindingsPanel > Static { width: 100%; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._body = Static(findings_text(None, None))
        self.findings: tuple[Finding, ...] | None = None
        self._error: str | None = None

    def compose(self):  # type: ignore[no-untyped-def]
        yield self._body

    def show(self, findings: tuple[Finding, ...] | None, error: str | None = None) -> None:
        if findings is None:
            findings = self.findings  # the rules failed this time: keep what was shown
        if findings == self.findings and error == self._error:
            return
        self.findings, self._error = findings, error
        self._body.update(shown(findings_text(findings, error)))
