"""Out-of-memory forecasts from per-step peaks, and batch-size headroom fits (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence

from memdoc.forecast.budget import trace_step_series
from memdoc.forecast.model import Forecast as Forecast
from memdoc.forecast.model import NoForecast, StepSeries
from memdoc.forecast.predict import analyse, earliest
from memdoc.trace.reader import Trace

__all__ = ["Forecast", "NoForecast", "StepSeries", "assess", "forecast"]


def assess(
    source: Trace | StepSeries | Sequence[StepSeries], *, until_s: float | None = None
) -> Forecast | NoForecast | None:
    """The forecast that crosses its limit first, else why there is none; None when the
    source has no steps or no measured quantity with a known limit."""
    if isinstance(source, Trace):
        candidates: Sequence[StepSeries] = trace_step_series(source, until_s=until_s)
    elif isinstance(source, StepSeries):
        candidates = [source]
    else:
        candidates = source
    return earliest([analyse(series) for series in candidates])


def forecast(
    source: Trace | StepSeries | Sequence[StepSeries], *, until_s: float | None = None
) -> Forecast | None:
    """When the per-step peak will cross the limit that applies, or None (no growth, too
    few steps, no known limit). Pure: reads the trace, writes nothing."""
    result = assess(source, until_s=until_s)
    return result if isinstance(result, Forecast) else None
