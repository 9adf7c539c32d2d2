"""The post-mortem HTML report: one self-contained file, plotly.js inline, no network."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from memdoc.errors import OutputExistsError
from memdoc.files import write_atomically
from memdoc.report import sections
from memdoc.report.data import ReportData
from memdoc.report.figures import Figure, ledger_figure, ranks_figure, steps_figure
from memdoc.report.inputs import load_inputs
from memdoc.report.timeline_figure import timeline_figure
from memdoc.rules.base import Finding
from memdoc.rules.engine import diagnose_run
from memdoc.trace import Run

_SCRIPT_CLOSE = re.compile(r"</(script)", re.IGNORECASE)


def render_html(run: Run, findings: list[Finding]) -> str:
    """The report of a run as one HTML page."""
    return render_data(ReportData.from_run(run, findings))


def render_data(data: ReportData) -> str:
    figures: dict[str, Figure] = {}
    for fig_id, figure in (
        ("fig-ledger", ledger_figure(data.ledgers)),
        ("fig-timeline", timeline_figure(data.timeline)),
        ("fig-steps", steps_figure(data.steps)),
        ("fig-ranks", ranks_figure(data.ranks)),
    ):
        if figure is not None:
            figures[fig_id] = figure
    body = [
        sections.what_happened(data),
        sections.findings(data.findings, data.none_found),
        sections.ledger(data.ledgers, "fig-ledger" in figures),
        sections.timeline(data.timeline, "fig-timeline" in figures),
        sections.steps(data.steps, "fig-steps" in figures),
        sections.allocations(data.allocations),
        sections.ranks(data.ranks, "fig-ranks" in figures),
    ]
    nav = [
        (anchor, label)
        for anchor, label in _NAV
        if any(part.startswith(f'<section id="{anchor}"') for part in body)
    ]
    return _template().substitute(
        title=sections.esc(f"memdoc · {data.title}"),
        css=_asset("report.css"),
        top=sections.top_bar(data, nav),
        body="".join(body),
        footer=sections.footer(data),
        figures=script_json(figures),
        plotly=_plotly_js(),
        script=_asset("report.js"),
    )


_NAV = (
    ("what", "What happened"),
    ("why", "Why"),
    ("ledger", "Ledger"),
    ("timeline", "Timeline"),
    ("steps", "Per step"),
    ("allocations", "Allocations"),
    ("ranks", "Ranks"),
)


def script_json(value: Any) -> str:
    """JSON that is safe inside <script>: no `</script>`, `<!--` or line separators survive."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@functools.cache
def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    # The bundle holds no "</script" today; keep it that way whatever version is installed.
    return str(_SCRIPT_CLOSE.sub(r"<\\/\1", get_plotlyjs()))


@functools.cache
def _asset(name: str) -> str:
    return resources.files("memdoc.report").joinpath(name).read_text(encoding="utf-8")


@functools.cache
def _template() -> Template:
    return Template(_asset("report.html"))


def write_report(
    paths: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *, force: bool = False
) -> Path:
    """Load, diagnose and render traces into `output`, atomically; never overwrite unless forced.

    Raises:
        OutputExistsError: `output` exists and `force` is false.
        MemdocError: an input cannot be read, or the output cannot be written.
    """
    out = Path(output)
    if out.exists() and not force:
        raise OutputExistsError(str(out))
    run = load_inputs(paths)
    data = ReportData.from_run(run, diagnose_run(run), title=Path(paths[0]).name)
    page = render_data(data)
    write_atomically(out, page)
    return out
