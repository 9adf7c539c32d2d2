"""The trace: data model, writer, reader, ledger. Imports from memdoc only units and errors."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memdoc.trace.model import (
    SCHEMA_VERSION,
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    ExitInfo,
    Header,
    Loss,
    Metric,
    OomInfo,
    ProcessInfo,
    ProcessUsage,
    SeriesKey,
    framework_metric,
)

if TYPE_CHECKING:
    from memdoc.trace.reader import Run, Series, StepStat, Trace, load_run, load_trace
    from memdoc.trace.writer import TraceWriter

# The reader and the writer are imported on first use, not with the package: a process that
# only needs the model (the agent in every process of a run) does not load them.
_LAZY = {
    "Run": "memdoc.trace.reader",
    "Series": "memdoc.trace.reader",
    "StepStat": "memdoc.trace.reader",
    "Trace": "memdoc.trace.reader",
    "load_run": "memdoc.trace.reader",
    "load_trace": "memdoc.trace.reader",
    "TraceWriter": "memdoc.trace.writer",
}

__all__ = [
    "SCHEMA_VERSION",
    "CollectorStatus",
    "DeviceInfo",
    "Event",
    "EventKind",
    "ExitInfo",
    "Header",
    "Loss",
    "Metric",
    "OomInfo",
    "ProcessInfo",
    "ProcessUsage",
    "Run",
    "Series",
    "SeriesKey",
    "StepStat",
    "Trace",
    "TraceWriter",
    "framework_metric",
    "load_run",
    "load_trace",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
