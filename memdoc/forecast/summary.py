"""The forecast line of the end-of-run summary: what was forecast during the run, or what
the run's steps forecast for a longer one."""

from __future__ import annotations

from memdoc.forecast import assess
from memdoc.forecast.model import Forecast
from memdoc.forecast.words import forecast_words
from memdoc.trace.model import EventKind
from memdoc.trace.reader import Trace


def first_forecast(trace: Trace) -> tuple[float, Forecast] | None:
    """(time, forecast) of the first `forecast` event that said an OOM was likely."""
    for event in trace.events(EventKind.FORECAST):
        if event.data.get("state") == "likely":
            forecast = Forecast.from_data(event.data)
            if forecast is not None:
                return event.t, forecast
    return None


def forecast_in_force(trace: Trace, t: float) -> str | None:
    """The last forecast written at or before `t`, in words; None when none is in force."""
    for event in reversed(trace.events(EventKind.FORECAST)):
        if event.t > t:
            continue
        said = Forecast.from_data(event.data) if event.data.get("state") == "likely" else None
        return forecast_words(said) if said is not None else None
    return None


def forecast_line(trace: Trace, *, ended_by_oom: bool) -> str | None:
    """After an OOM: when memdoc first forecast it, if it did. After a run that ended
    otherwise: where its growth leads; None when it did not grow or had too few steps."""
    if ended_by_oom:
        first = first_forecast(trace)
        if first is None:
            return None
        _, said = first
        return f"forecast at step {said.step:,}: " + forecast_words(said).removeprefix(
            "OOM forecast: "
        )
    result = assess(trace)
    # "No growth" is the quiet case: a clean run's summary stays one line.
    return forecast_words(result) if isinstance(result, Forecast) else None
