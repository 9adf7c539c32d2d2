"""Plotly figures (plain dicts, drawn by plotly.js) from computed report data."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from memdoc.report.data import RankRow
from memdoc.report.downsample import minmax_downsample
from memdoc.report.timeline import StepTable
from memdoc.trace.ledger import Ledger
from memdoc.units import GiB, KiB, MiB, format_bytes, format_percent

Figure = dict[str, Any]

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
GRID = "#eceff3"
ROW_HEIGHT_PX = 230

# One colour per memory layer, the same in every figure.
LAYER_COLORS = {
    "used": "#6b7280",
    "process": "#7c3aed",
    "reserved": "#93c5fd",
    "allocated": "#2563eb",
    "peak": "#1e3a8a",
    "rss": "#059669",
    "cgroup": "#0d9488",
    "limit": "#dc2626",
}
TERM_COLORS = {
    "allocated": "#2563eb",
    "cached_free": "#93c5fd",
    "reserved": "#60a5fa",
    "process_other": "#a78bfa",
    "other_processes": "#f59e0b",
    "free": "#e5e7eb",
    "unexplained": "#9ca3af",
}
MARKER_COLORS = {"mark": "#6b7280", "oom": "#dc2626", "exception": "#ea580c", "exit": "#dc2626"}


def text(value: str) -> str:
    """Trace text for plotly.js, which reads a few HTML tags in labels: keep it literal."""
    return html.escape(value, quote=True)


def unit_for(max_bytes: float) -> tuple[str, float]:
    for name, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if max_bytes >= size:
            return name, float(size)
    return "B", 1.0


def scaled(values: Sequence[float], scale: float) -> list[float]:
    return [round(v / scale, 5) for v in values]


def base_layout(height_px: int) -> dict[str, Any]:
    return {
        "height": height_px,
        "margin": {"l": 70, "r": 30, "t": 30, "b": 40},
        "font": {"family": FONT, "size": 12, "color": "#1f2937"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "hoverlabel": {"font": {"family": FONT, "size": 12}},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
    }


def panel_title(title: str, top: float) -> dict[str, Any]:
    return {
        "xref": "paper",
        "yref": "paper",
        "x": 0,
        "y": top,
        "xanchor": "left",
        "yanchor": "bottom",
        "showarrow": False,
        "text": f"<b>{text(title)}</b>",
        "font": {"size": 12, "color": "#374151"},
    }


# -- ledger -------------------------------------------------------------------------------


def ledger_label(ledger: Ledger) -> str:
    when = "at the OOM" if ledger.moment == "oom" else "at peak"
    at = f" ({ledger.t:.1f} s)" if ledger.t is not None else ""
    return f"GPU {ledger.device} · {when}{at}"


def ledger_figure(ledgers: Sequence[Ledger]) -> Figure | None:
    """Stacked horizontal bars: one per device and moment, one colour per kind of memory."""
    if not ledgers:
        return None
    biggest = max(*(lg.total_bytes or lg.accounted_bytes for lg in ledgers), 1)
    unit, scale = unit_for(biggest)
    rows = [ledger_label(lg) for lg in ledgers]
    labels = list(dict.fromkeys(term.label for lg in ledgers for term in lg.terms))
    data: list[dict[str, Any]] = []
    for label in labels:
        xs: list[float | None] = []
        hover: list[str] = []
        key = "unexplained"
        for lg in ledgers:
            found = [t for t in lg.terms if t.label == label]
            amount = sum(t.bytes for t in found) if found else None
            key = found[0].key if found else key
            xs.append(None if amount is None else round(max(amount, 0) / scale, 4))
            share = amount / lg.total_bytes if amount is not None and lg.total_bytes else None
            hover.append(
                f"{format_bytes(amount, 2)} ({format_percent(share)})" if amount is not None else ""
            )
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": text(label),
                "y": rows,
                "x": xs,
                "customdata": hover,
                "hovertemplate": "%{customdata}<extra>" + text(label) + "</extra>",
                "marker": {
                    "color": TERM_COLORS.get(key, "#9ca3af"),
                    "line": {"color": "#ffffff", "width": 1},
                    **(
                        {"pattern": {"shape": "/", "fgcolor": "#6b7280"}}
                        if key == "unexplained"
                        else {}
                    ),
                },
            }
        )
    layout = base_layout(110 + 56 * len(rows))
    layout.update(
        barmode="stack",
        margin={"l": 190, "r": 30, "t": 40, "b": 40},
        xaxis={"title": {"text": unit}, "gridcolor": GRID, "rangemode": "tozero"},
        yaxis={"autorange": "reversed"},
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "traceorder": "normal"},
        bargap=0.35,
    )
    layout["height"] += 40
    return {"data": data, "layout": layout}


# -- per step -----------------------------------------------------------------------------


def steps_figure(tables: Sequence[StepTable], max_points: int = 2000) -> Figure | None:
    """Baseline after and peak inside each step: a leak is a slope, the optimizer a first jump."""
    if not tables:
        return None
    layout = base_layout(ROW_HEIGHT_PX * len(tables) + 90)
    gap = 0.14 if len(tables) > 1 else 0.0
    height = (1.0 - gap * (len(tables) - 1)) / len(tables)
    data: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, table in enumerate(tables):
        suffix = "" if i == 0 else str(i + 1)
        top = 1.0 - i * (height + gap)
        values = [v for r in table.rows for v in (r.baseline, r.peak) if v is not None]
        unit, scale = unit_for(max(values, default=1.0))
        for field in ("peak", "baseline"):
            points = [(float(r.step), getattr(r, field)) for r in table.rows]
            if field == "baseline" and table.start_bytes is not None:
                points.insert(0, (0.0, table.start_bytes))  # before step 1: shows the first jump
            kept = [(x, y) for x, y in points if y is not None]
            xs, ys = minmax_downsample([p[0] for p in kept], [p[1] for p in kept], max_points)
            data.append(_step_trace(field, xs, ys, scale, suffix, show_legend=i == 0))
        layout[f"yaxis{suffix}"] = {
            "domain": [max(top - height, 0.0), top],
            "title": {"text": unit, "font": {"size": 11}},
            "rangemode": "tozero",
            "gridcolor": GRID,
        }
        layout[f"xaxis{suffix}"] = {
            "anchor": f"y{suffix}",
            "title": {"text": "step"},
            "gridcolor": GRID,
            "rangemode": "tozero",
        }
        annotations.append(panel_title(table.title, top))
    layout["annotations"] = annotations
    layout["margin"] = {"l": 70, "r": 30, "t": 50, "b": 40}
    layout["legend"] = {"orientation": "h", "x": 1, "xanchor": "right", "y": 1, "yanchor": "bottom"}
    return {"data": data, "layout": layout}


_STEP_STYLE = {
    "peak": ("peak inside the step", "#f59e0b", "dot"),
    "baseline": ("baseline after the step", "#2563eb", "solid"),
}


def _step_trace(
    field: str, xs: list[float], ys: list[float], scale: float, suffix: str, *, show_legend: bool
) -> dict[str, Any]:
    name, color, dash = _STEP_STYLE[field]
    return {
        "type": "scatter",
        "mode": "lines+markers" if len(xs) <= 200 else "lines",
        "name": name,
        "legendgroup": field,
        "showlegend": show_legend,
        "x": xs,
        "y": scaled(ys, scale),
        "customdata": [format_bytes(v, 2) for v in ys],
        "hovertemplate": "step %{x}: %{customdata}<extra>" + name + "</extra>",
        "line": {"color": color, "width": 2, "dash": dash},
        "marker": {"size": 5, "color": color},
        "xaxis": f"x{suffix}",
        "yaxis": f"y{suffix}",
    }


# -- ranks --------------------------------------------------------------------------------


def ranks_figure(ranks: Sequence[RankRow]) -> Figure | None:
    """Every rank's memory on one wall-clock axis; the rank that failed first stands out."""
    lines = [r for r in ranks if r.line is not None]
    if not lines:
        return None
    biggest = max(max(r.line.values_bytes, default=1.0) for r in lines if r.line is not None)
    unit, scale = unit_for(biggest)
    data: list[dict[str, Any]] = []
    for row in lines:
        assert row.line is not None
        failed = row.failed_first
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": text(row.label + (" (failed first)" if failed else "")),
                "x": list(row.line.times_s),
                "y": scaled(row.line.values_bytes, scale),
                "customdata": [format_bytes(v, 2) for v in row.line.values_bytes],
                "hovertemplate": "%{customdata}",
                "line": {
                    "width": 3 if failed else 1.5,
                    "shape": "hv",
                    **({"color": "#dc2626"} if failed else {}),
                },
            }
        )
        if failed and row.ending.t is not None:
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": text(f"{row.label}: {row.ending.text}"),
                    "x": [round(row.ending.t + row.offset_s, 3)],
                    "y": [round(max(row.line.values_bytes, default=0.0) / scale, 4)],
                    "marker": {"symbol": "x", "size": 14, "color": "#dc2626"},
                    "hovertemplate": text(row.ending.text) + "<extra></extra>",
                }
            )
    layout = base_layout(360)
    layout.update(
        xaxis={"title": {"text": "seconds since the first rank started"}, "gridcolor": GRID},
        yaxis={
            "title": {"text": f"held on the busiest GPU ({unit})"},
            "gridcolor": GRID,
            "rangemode": "tozero",
        },
        hovermode="x unified",
    )
    return {"data": data, "layout": layout}
