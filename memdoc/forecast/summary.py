"""The forecast line of the end-of-run summary: after an OOM, what was forecast for the limit
that ran out; after a run that ended well, where its growth leads, when that is near."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memdoc.forecast import assess
from memdoc.forecast.model import Forecast
from memdoc.forecast.words import forecast_words
from memdoc.kinds import OomKind
from memdoc.trace.model import EventKind, Metric, OomInfo
from memdoc.trace.reader import Trace, oom_of

Applies = Callable[[Forecast], bool]

# Errors of the host's memory, not of a framework's pool or a device.
HOST_KINDS = frozenset(
    {OomKind.HOST_KILL, OomKind.HOST_ALLOC, OomKind.SHM, OomKind.DATALOADER_KILLED}
)
HOST_METRICS = frozenset({Metric.HOST_VMS, Metric.CGROUP_USAGE, Metric.HOST_RSS})


def first_forecast(trace: Trace, applies: Applies | None = None) -> tuple[float, Forecast] | None:
    """(time, forecast) of the first `forecast` event that said an OOM was likely (for a
    limit that `applies`, when given)."""
    for event in trace.events(EventKind.FORECAST):
        if event.data.get("state") == "likely":
            forecast = Forecast.from_data(event.data)
            if forecast is not None and (applies is None or applies(forecast)):
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
    """After an OOM: when memdoc first forecast it for the limit that ran out, if it did.
    After a run that ended otherwise: where its growth leads, when the limit that would be
    reached first is within the run's own length again; None otherwise (no growth, growth
    that stopped, too few steps, a limit far beyond what the run did)."""
    if ended_by_oom:
        return _forecast_of_the_oom(trace)
    result = assess(trace)
    # "No growth" is the quiet case: a clean run's summary stays one line.
    if not isinstance(result, Forecast) or result.steps_left > result.step:
        return None
    return forecast_words(result)


def _forecast_of_the_oom(trace: Trace) -> str | None:
    event = trace.ending_oom_event()
    oom = oom_of(event) if event is not None else None
    applies = applied_limit(oom, event.data.get("host") if event is not None else None)
    first = first_forecast(trace, applies)
    if first is None:
        return None
    _, said = first
    words = forecast_words(said).removeprefix("OOM forecast: ")
    return f"forecast at step {said.step:,}: {words}"


def applied_limit(oom: OomInfo | None, host: Any) -> Applies | None:
    """Which forecasts speak of the limit that `oom` ran into (None: any)."""
    if oom is None:
        return None
    if oom.kind in HOST_KINDS:
        metrics = _host_metrics(oom, host if isinstance(host, Mapping) else {})
        return lambda f: f.metric in metrics
    return lambda f: f.metric not in HOST_METRICS and _same_device(f, oom)


def _host_metrics(oom: OomInfo, host: Mapping[str, Any]) -> frozenset[str]:
    """A failed allocation under an address-space cap is the cap; a kill inside a limited
    cgroup is the cgroup; without the process's figures, any host limit."""
    if oom.kind == OomKind.HOST_ALLOC and host.get("rlimit_as_bytes"):
        return frozenset({Metric.HOST_VMS})
    if host.get("cgroup_limit_bytes"):
        return frozenset({Metric.CGROUP_USAGE})
    return HOST_METRICS if not host else frozenset({Metric.HOST_RSS, Metric.CGROUP_USAGE})


def _same_device(said: Forecast, oom: OomInfo) -> bool:
    if said.device is None:
        return False
    if oom.device_type == "cpu":
        return said.device < 0  # a framework's host allocator
    return oom.device is None or said.device == oom.device
