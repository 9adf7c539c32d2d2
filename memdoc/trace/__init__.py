"""The trace: data model, writer, reader, ledger. Imports from memdoc only units and errors."""

from __future__ import annotations

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
from memdoc.trace.reader import Run, Series, StepStat, Trace, load_run, load_trace
from memdoc.trace.writer import TraceWriter

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
