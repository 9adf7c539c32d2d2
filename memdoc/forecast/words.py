"""A forecast in one line of words, the same in the dashboard and the end-of-run summary."""

from __future__ import annotations

from memdoc.forecast.model import Forecast, NoForecast
from memdoc.units import format_bytes


def forecast_words(result: Forecast | NoForecast) -> str:
    """`OOM forecast: +3.2 MiB/step, address-space cap (RLIMIT_AS) 1.1 GiB reached at step
    4,200 (4,100–4,350), in about 35 min`, or `OOM forecast: no growth over 180 steps`."""
    if isinstance(result, NoForecast):
        return f"OOM forecast: {result.detail}"
    when = f"step {result.oom_step:,}"
    if result.oom_step_late > result.oom_step_early:
        when += f" ({result.oom_step_early:,}–{result.oom_step_late:,})"
    line = (
        f"OOM forecast: +{format_bytes(result.growth_bytes_per_step)}/step, "
        f"{result.limit_label} {format_bytes(result.limit_bytes)} reached at {when}"
    )
    if result.eta_s is not None:
        line += f", in about {duration_words(result.eta_s)}"
    return line


def duration_words(seconds: float) -> str:
    """12 s, 35 min, 3.5 h, 2.1 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
