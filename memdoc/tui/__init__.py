"""The live dashboard: one Textual app over a growing trace, a finished trace, or the system."""

from __future__ import annotations

from memdoc.tui.app import MemdocApp, make_app
from memdoc.tui.sources import ReplaySource, SampleSource, SourceState, TraceFollowSource

__all__ = [
    "MemdocApp",
    "ReplaySource",
    "SampleSource",
    "SourceState",
    "TraceFollowSource",
    "make_app",
]
