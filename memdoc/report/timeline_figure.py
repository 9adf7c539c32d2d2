"""The timeline figure: every memory layer per device and the host, on one zoomable time axis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memdoc.report.figures import (
    GRID,
    LAYER_COLORS,
    MARKER_COLORS,
    ROW_HEIGHT_PX,
    Figure,
    base_layout,
    panel_title,
    scaled,
    text,
    unit_for,
)
from memdoc.report.timeline import Line, Marker, Panel, Timeline
from memdoc.units import format_bytes

MAX_ANNOTATED_MARKS = 40


def _line_trace(line: Line, panel: Panel, yaxis: str, scale: float) -> dict[str, Any]:
    color = LAYER_COLORS.get(line.role, "#374151")
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "lines",
        "name": text(line.name),
        "legendgroup": panel.key,
        "legendgrouptitle": {"text": text(panel.title)},
        "x": list(line.times_s),
        "y": scaled(line.values_bytes, scale),
        "customdata": [format_bytes(v, 2) for v in line.values_bytes],
        "hovertemplate": "%{customdata}",
        "line": {"color": color, "width": 1.5, "shape": "hv"},
        "yaxis": yaxis,
        "xaxis": "x",
    }
    if line.role in ("reserved", "allocated", "rss"):
        trace["fill"] = "tozeroy"
        trace["fillcolor"] = color + ("55" if line.role == "reserved" else "40")
    if line.role in ("peak", "limit", "process"):
        trace["line"]["dash"] = "dot" if line.role == "peak" else "dash"
    return trace


def timeline_figure(timeline: Timeline) -> Figure | None:
    """One row per device and one for the host, on one shared, zoomable time axis."""
    panels = timeline.panels
    if not panels:
        return None
    layout = base_layout(ROW_HEIGHT_PX * len(panels) + 140)
    gap = 0.06 if len(panels) > 1 else 0.0
    height = (1.0 - gap * (len(panels) - 1)) / len(panels)
    data: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, panel in enumerate(panels):
        axis = "y" if i == 0 else f"y{i + 1}"
        top = 1.0 - i * (height + gap)
        biggest = max([max(line.values_bytes, default=0.0) for line in panel.lines] + [1.0])
        unit, scale = unit_for(max(biggest, float(panel.total_bytes or 0)))
        layout["yaxis" if i == 0 else f"yaxis{i + 1}"] = {
            "domain": [max(top - height, 0.0), top],
            "title": {"text": unit, "font": {"size": 11}},
            "rangemode": "tozero",
            "gridcolor": GRID,
            "zeroline": False,
        }
        annotations.append(panel_title(panel.title, top))
        data.extend(_line_trace(line, panel, axis, scale) for line in panel.lines)
        if panel.total_bytes and panel.device is not None:
            shapes.append(_total_shape(axis, panel.total_bytes / scale))
            annotations.append(_total_note(axis, panel.total_bytes, panel.total_bytes / scale))
    bottom_axis = "y" if len(panels) == 1 else f"y{len(panels)}"
    span = [0, max(timeline.duration_s, 1e-3)]
    layout["xaxis"] = {
        "anchor": bottom_axis,
        "title": {"text": "seconds since start"},
        "gridcolor": GRID,
        "rangeslider": {"visible": True, "thickness": 0.06, "range": span},
        "hoverformat": ".2f",
        "range": span,
    }
    layout["legend"] = {
        "orientation": "v",
        "x": 1.01,
        "y": 1,
        "yanchor": "top",
        "groupclick": "toggleitem",
    }
    layout["margin"] = {"l": 70, "r": 20, "t": 56, "b": 40}
    shapes.extend(
        {**_vline(t, "#dbe1e8", 1, "solid"), "layer": "below"} for t in timeline.step_times_s
    )
    shapes.extend(_marker_line(m) for m in timeline.markers)
    annotations.extend(_marker_note(m) for m in _spaced(timeline.markers, span[1] / 40))
    layout.update(shapes=shapes, annotations=annotations, hovermode="x unified")
    return {"data": data, "layout": layout}


def _spaced(found: Sequence[Marker], min_gap_s: float) -> list[Marker]:
    """Markers to label: OOMs always, others when not crowding the previous label."""
    chosen: list[Marker] = []
    for marker in sorted(found, key=lambda m: (m.kind != "oom", m.t)):
        crowded = any(abs(marker.t - c.t) < min_gap_s for c in chosen)
        if marker.kind == "oom" or (not crowded and len(chosen) < MAX_ANNOTATED_MARKS):
            chosen.append(marker)
    return chosen


def _marker_line(marker: Marker) -> dict[str, Any]:
    oom = marker.kind == "oom"
    return _vline(marker.t, MARKER_COLORS[marker.kind], 2 if oom else 1, "solid" if oom else "dash")


def _vline(t: float, color: str, width: float, dash: str) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": t,
        "x1": t,
        "y0": 0,
        "y1": 1,
        "line": {"color": color, "width": width, "dash": dash},
    }


def _total_shape(axis: str, y: float) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "paper",
        "yref": axis,
        "x0": 0,
        "x1": 1,
        "y0": y,
        "y1": y,
        "line": {"color": "#9ca3af", "width": 1, "dash": "longdash"},
    }


def _total_note(axis: str, total_bytes: int, y: float) -> dict[str, Any]:
    return {
        "xref": "paper",
        "yref": axis,
        "x": 1,
        "y": y,
        "xanchor": "right",
        "yanchor": "bottom",
        "showarrow": False,
        "text": f"device total {format_bytes(total_bytes)}",
        "font": {"size": 10, "color": "#6b7280"},
    }


def _marker_note(marker: Marker) -> dict[str, Any]:
    label = {"oom": "OOM", "exit": "end"}.get(marker.kind, marker.label[:24])
    return {
        "xref": "x",
        "yref": "paper",
        "x": marker.t,
        "y": 1,
        "yanchor": "bottom",
        "yshift": 18,
        "showarrow": False,
        "text": text(label),
        "hovertext": text(f"{marker.label} at {marker.t:.2f} s"),
        "font": {"size": 11, "color": MARKER_COLORS[marker.kind]},
    }
