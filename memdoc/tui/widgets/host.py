"""The host panel: the run's RSS, system memory, swap, and the cgroup's limit when there is one."""

from __future__ import annotations

from rich.text import Text

from memdoc.tui.palette import ERROR, MUTED, fill_style
from memdoc.tui.view import HostView
from memdoc.tui.widgets.text import LinesWidget, pack
from memdoc.units import format_bytes, format_percent


def host_items(host: HostView | None) -> list[Text]:
    """One item per fact, to be packed into lines as the width allows."""
    items = [Text("Host", style="bold")]
    if host is None:
        return [*items, Text("nothing recorded yet", style=MUTED)]
    if host.rss_bytes is not None:
        items.append(Text.assemble("run RSS ", (format_bytes(host.rss_bytes), "bold")))
    if host.total_bytes is not None:
        available = host.available_bytes
        used = None if available is None else 1 - available / host.total_bytes
        items.append(
            Text.assemble(
                "available ",
                (format_bytes(available), fill_style(used)),
                f" of {format_bytes(host.total_bytes)}",
            )
        )
    if host.swap_used_bytes:
        items.append(Text(f"swap {format_bytes(host.swap_used_bytes)}", style=MUTED))
    if host.cgroup_limit_bytes is not None:
        usage = host.cgroup_usage_bytes
        fraction = None if usage is None else usage / host.cgroup_limit_bytes
        items.append(
            Text.assemble(
                "cgroup ",
                (format_bytes(usage), fill_style(fraction)),
                f" of {format_bytes(host.cgroup_limit_bytes)} ({format_percent(fraction)})",
            )
        )
    if host.cgroup_oom_kills:
        items.append(Text(f"{host.cgroup_oom_kills} OOM kill(s) in the cgroup", style=ERROR))
    return items


class HostPanel(LinesWidget):
    DEFAULT_CSS = """
    HostPanel { height: auto; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._host: HostView | None = None

    def show(self, host: HostView | None) -> None:
        if host != self._host:
            self._host = host
            self.update_lines()

    def lines(self, width: int) -> list[Text]:
        return pack(host_items(self._host), width)
