"""The moments a report shows the device ledger at: each GPU's peak, and the OOM."""

from __future__ import annotations

from memdoc.trace import Metric, OomInfo, Series, Trace
from memdoc.trace.ledger import Ledger, ledger_at, ledger_at_oom
from memdoc.trace.reader import sum_series


def held_series(trace: Trace, device: int) -> Series | None:
    """The series that best says how much this run held on a device: pool, driver, or live."""
    pools = list(trace.framework_series(Metric.RESERVED, device).values())
    if pools:
        return pools[0] if len(pools) == 1 else sum_series(pools)
    used = trace.series(Metric.GPU_USED, device)
    if used is not None and used.values:
        return used
    live = list(trace.framework_series(Metric.ALLOCATED, device).values())
    if live:
        return live[0] if len(live) == 1 else sum_series(live)
    return None


def peak_moment(trace: Trace, device: int) -> float | None:
    """When the run held the most on a device (a sample instant, so every layer was read).

    Among instants that tie, the one with the most live memory: the pool often stays at its
    high-water mark while the live bytes that filled it come and go.
    """
    series = held_series(trace, device)
    if series is None or not series.values:
        return None
    top = max(series.values)
    tied = [t for t, v in zip(series.times, series.values, strict=True) if v == top]
    live = list(trace.framework_series(Metric.ALLOCATED, device).values())
    if len(tied) == 1 or not live:
        return tied[0]
    return max(tied, key=lambda t: sum(s.at(t) or 0.0 for s in live))


def oom_device(trace: Trace, oom: OomInfo) -> int | None:
    """The GPU an OOM happened on: named by the error, or the only GPU recorded."""
    if oom.framework == "host" or oom.device_type in ("cpu", "tpu"):
        return None
    if oom.device is not None:
        return oom.device
    gpus = [d.index for d in trace.devices() if d.index >= 0]
    return gpus[0] if len(gpus) == 1 else None


def device_ledgers(trace: Trace, oom: OomInfo | None, oom_t: float | None) -> list[Ledger]:
    """For each GPU: the ledger at the run's peak, and at the OOM when it happened there."""
    ledgers: list[Ledger] = []
    failed_on = oom_device(trace, oom) if oom is not None else None
    indices = {d.index for d in trace.devices() if d.index >= 0}
    if failed_on is not None:
        indices.add(failed_on)
    for device in sorted(indices):
        t_peak = peak_moment(trace, device)
        if t_peak is not None:
            ledgers.append(ledger_at(trace, device, t_peak, moment="peak"))
        if oom is not None and device == failed_on:
            ledgers.append(ledger_at_oom(trace, device, oom, oom_t))
    return ledgers
