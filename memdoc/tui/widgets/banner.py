"""The OOM banner: what failed, how much was asked and free, and the diagnosis once known."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from memdoc.rules.base import Finding
from memdoc.tui.palette import MUTED
from memdoc.tui.view import OomView
from memdoc.tui.widgets.chart import format_trace_time
from memdoc.tui.widgets.findings import CODE_STYLE, first_line
from memdoc.tui.widgets.text import shown
from memdoc.units import format_bytes, format_percent


def oom_text(oom: OomView, findings: tuple[Finding, ...] | None) -> Text:
    info = oom.oom
    headline = "✖ OUT OF MEMORY" if not oom.handled else "✖ OOM (caught by the program)"
    text = Text.assemble((headline, "bold"))
    where = f" at {format_trace_time(oom.t_s)}"
    if info.device is not None:
        where += f" on GPU {info.device}" if info.device >= 0 else " on the host device"
    if info.framework not in ("", "unknown"):
        where += f" ({info.framework})"
    text.append(where)
    details = []
    if info.requested_bytes is not None:
        details.append(f"tried to allocate {format_bytes(info.requested_bytes)}")
    if info.free_bytes is not None:
        free = f"{format_bytes(info.free_bytes)} free"
        if info.total_bytes is not None:
            free += f" of {format_bytes(info.total_bytes)}"
        details.append(free)
    if details:
        text.append(": " + "; ".join(details))
    elif info.message:
        text.append(": " + info.message.splitlines()[0][:200])
    text.append("\n")
    if not findings:
        text.append("diagnosing…" if findings is None else "no rule explains it yet", style=MUTED)
        return text
    top = findings[0]
    text.append("diagnosis: ", style="bold")
    text.append(f"{top.title} ({format_percent(top.confidence)})")
    code = first_line(top.fixes[0].code) if top.fixes else ""
    if code:
        # The fix's code is what to act on; its title and the rest are in the findings panel.
        text.append("\nfix: ", style="bold")
        text.append(code, style=CODE_STYLE)
    return text


class OomBanner(Static):
    """Hidden until an OOM has been shown."""

    DEFAULT_CSS = """
    OomBanner { display: none; height: auto; background: #5c1010; color: #ffffff; padding: 0 1; }
    OomBanner.-visible { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._key: tuple[OomView | None, tuple[Finding, ...] | None] | None = None

    def show(self, oom: OomView | None, findings: tuple[Finding, ...] | None) -> None:
        key = (oom, findings if oom is not None else None)
        if key == self._key:
            return
        self._key = key
        self.set_class(oom is not None, "-visible")
        if oom is not None:
            self.update(shown(oom_text(oom, findings)))
