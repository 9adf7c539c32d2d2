"""The dashboard's colours, one name per meaning, shared by every widget that draws memory."""

from __future__ import annotations

# Ledger segments and chart layers, by Segment.key.
SEGMENT_STYLES: dict[str, str] = {
    "allocated": "#3fb950",
    "cached": "#d29922",
    "ours_other": "#a371f7",
    "others": "#f778ba",
    "ours_rss": "#3fb950",
    "unexplained": "#8b949e",
    "free": "#484f58",
}
RESERVED_BG = "#3b2f0b"  # the framework pool behind the allocated level
PEAK = "bold #ffffff"
LIMIT = "#f85149"
STEP = "#6e7681"
MARK = "bold #39c5cf"
OOM = "bold #ff5555"
OURS = "bold #3fb950"
MUTED = "#8b949e"
WARNING = "#e3b341"
ERROR = "bold #ff5555"


def fill_style(fraction: float | None) -> str:
    """Green, yellow, red as a device fills up."""
    if fraction is None:
        return MUTED
    if fraction >= 0.9:
        return "bold #ff5555"
    if fraction >= 0.7:
        return "#e3b341"
    return "#3fb950"
