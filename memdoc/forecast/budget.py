"""Which measured quantity runs into which limit, and its per-step peaks from a trace."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.forecast.model import StepSeries
from memdoc.trace.model import (
    FRAMEWORK_NAMES,
    FRAMEWORK_PREFIXES,
    Event,
    EventKind,
    Metric,
    SeriesKey,
)
from memdoc.trace.phases import changes_batch_size
from memdoc.trace.reader import Trace

_PREFIX_TO_FRAMEWORK = {prefix: fw for fw, prefix in FRAMEWORK_PREFIXES.items()}


@dataclass(frozen=True)
class Budget:
    """A measured series, the series holding its limit, and what the limit is called.

    `total_device` names the device whose total memory is the limit where no limit
    series was recorded (a framework pool on a GPU).
    """

    measured: SeriesKey
    limit: SeriesKey | None
    label: str
    total_device: int | None = None

    @property
    def total_label(self) -> str:
        """What the limit is called when it is the device total."""
        return f"GPU {self.total_device} total"


def budget_for(key: SeriesKey) -> Budget | None:
    """The limit a measured series runs into; None for series that are not measured."""
    metric, device, pid = key.metric, key.device, key.pid
    if metric == Metric.HOST_VMS and pid is not None:
        return Budget(
            key, SeriesKey(Metric.HOST_RLIMIT_AS, pid=pid), "address-space cap (RLIMIT_AS)"
        )
    if metric == Metric.CGROUP_USAGE:
        return Budget(key, SeriesKey(Metric.CGROUP_LIMIT), "cgroup memory limit")
    if metric in (Metric.HOST_ANON, Metric.HOST_RSS) and pid is None:
        return Budget(key, SeriesKey(Metric.HOST_TOTAL), "host RAM")
    if metric == Metric.GPU_USED and device is not None:
        return Budget(key, SeriesKey(Metric.GPU_TOTAL, device), f"GPU {device} total", device)
    prefix, _, quantity = metric.partition(".")
    framework = _PREFIX_TO_FRAMEWORK.get(prefix)
    if framework is None or device is None:
        return None
    limit = SeriesKey(f"{prefix}.{Metric.LIMIT}", device, pid)
    name = FRAMEWORK_NAMES[framework]
    if quantity in (Metric.RESERVED, Metric.ALLOCATED) and device >= 0:
        # The pool crosses first where it is recorded; live tensors alone where it is not.
        return Budget(key, limit, f"{name} memory limit on GPU {device}", device)
    if quantity == Metric.ALLOCATED and device < 0:
        return Budget(key, limit, f"{name} host allocator limit")
    return None


def superseded_by(key: SeriesKey) -> SeriesKey | None:
    """The series whose budget replaces this one's where both are recorded: the job's
    resident memory runs into the RAM as its own part does (`host.anon`), since the file
    pages that RSS also counts are given back under pressure before anything runs out."""
    if key.metric == Metric.HOST_RSS and key.pid is None:
        return SeriesKey(Metric.HOST_ANON)
    return None


def is_limit(key: SeriesKey) -> bool:
    """True for series that hold a limit rather than a use (a cap, a total)."""
    limits = (Metric.HOST_RLIMIT_AS, Metric.CGROUP_LIMIT, Metric.HOST_TOTAL, Metric.GPU_TOTAL)
    return key.metric in limits or key.metric.endswith("." + Metric.LIMIT)


def peak_source(key: SeriesKey) -> SeriesKey | None:
    """The measured series an interval-peak series belongs to (`torch.reserved_peak` ->
    `torch.reserved`); None for other series."""
    for quantity, peak in (
        (Metric.RESERVED, Metric.RESERVED_PEAK),
        (Metric.ALLOCATED, Metric.ALLOCATED_PEAK),
    ):
        if key.metric.endswith("." + peak):
            return SeriesKey(key.metric[: -len(peak)] + quantity, key.device, key.pid)
    return None


def step_peaks(
    step_times: Sequence[float],
    sources: Sequence[tuple[Sequence[float], Sequence[float]]],
) -> list[float | None]:
    """For each step window (previous boundary, boundary], the highest value any source
    recorded in it; None when none did."""
    out: list[float | None] = []
    t_prev = float("-inf")
    for t in step_times:
        best: float | None = None
        for times, values in sources:
            i = bisect.bisect_right(times, t_prev)
            j = bisect.bisect_right(times, t)
            if j > i:
                top = max(values[i:j])
                best = top if best is None else max(best, top)
        out.append(best)
        t_prev = t
    return out


def assemble(
    budget: Budget,
    steps: Sequence[int],
    step_times: Sequence[float],
    peaks: Sequence[float | None],
    limit_bytes: float | None,
    *,
    label: str | None = None,
    plan: LoopPlan | None = None,
) -> StepSeries | None:
    """A StepSeries from the steps that saw a value; None when the limit is unknown."""
    if not limit_bytes:
        return None
    kept = [(s, t, p) for s, t, p in zip(steps, step_times, peaks, strict=True) if p is not None]
    return StepSeries(
        metric=budget.measured.metric,
        limit_bytes=float(limit_bytes),
        limit_label=label or budget.label,
        steps=[s for s, _, _ in kept],
        times_s=[t for _, t, _ in kept],
        peak_bytes=[p for _, _, p in kept],
        device=budget.measured.device,
        pid=budget.measured.pid,
        planned_end_step=plan.end_step if plan else None,
        loop_start_step=plan.epochs[0] if plan and plan.epochs else None,
        epoch_steps=plan.epochs[1] if plan and plan.epochs else None,
    )


def planned_end(mark: Event, last_step: int) -> int | None:
    """The last step a loop will run, from the mark of its training phase (`planned_steps`,
    where the loop knows them) and the last step recorded before that mark."""
    planned = mark.data.get("planned_steps")
    if mark.kind != EventKind.MARK or not isinstance(planned, int) or planned <= 0:
        return None
    return last_step + planned


def planned_epochs(mark: Event, last_step: int) -> tuple[int, int] | None:
    """(the last step before the loop's first, the steps of one epoch) from the mark of its
    training phase, where the loop said both and will run more than one epoch."""
    planned, epoch = mark.data.get("planned_steps"), mark.data.get("epoch_steps")
    if mark.kind != EventKind.MARK or not isinstance(planned, int):
        return None
    if not isinstance(epoch, int) or not 0 < epoch < planned:
        return None
    return last_step, epoch


@dataclass(frozen=True)
class LoopPlan:
    """What the last loop that said so plans: its end, and its epochs."""

    end_step: int | None = None
    epochs: tuple[int, int] | None = None  # see `planned_epochs`


def loop_plan(mark: Event, last_step: int) -> LoopPlan | None:
    """The plan a loop's mark says, `last_step` the last step recorded before it; None for
    a mark that plans nothing."""
    end = planned_end(mark, last_step)
    return LoopPlan(end, planned_epochs(mark, last_step)) if end is not None else None


def trace_plan(
    trace: Trace, steps: Sequence[int], step_times: Sequence[float], until_s: float | None
) -> LoopPlan:
    """The plan of the last loop that said it, up to `until_s`."""
    plan = LoopPlan()
    for mark in trace.marks():
        if until_s is not None and mark.t > until_s:
            break
        before = bisect.bisect_right(step_times, mark.t)
        plan = loop_plan(mark, steps[before - 1] if before else 0) or plan
    return plan


def trace_step_series(trace: Trace, *, until_s: float | None = None) -> list[StepSeries]:
    """Every measured quantity of a trace with a known limit, as per-step peaks (steps up
    to `until_s` when given: what a forecast made at that moment would have seen)."""
    every = trace.steps()
    kept = [
        (t, number)
        for t, number in zip(every.times(), every.values("step"), strict=True)
        if until_s is None or t <= until_s
    ]
    steps = [_step_number(number, i) for i, (_, number) in enumerate(kept)]
    step_times = [t for t, _ in kept]
    plan = trace_plan(trace, steps, step_times, until_s)
    # A batch-size finder's sizes are a regime each: the trend starts after the last one.
    since = max(
        (
            m.t
            for m in trace.marks()
            if changes_batch_size(m) and (until_s is None or m.t <= until_s)
        ),
        default=None,
    )
    if since is not None:
        first = bisect.bisect_right(step_times, since)
        steps, step_times = steps[first:], step_times[first:]
    out: list[StepSeries] = []
    if not steps:
        return out
    keys = trace.series_keys()
    peaks_of: dict[SeriesKey, list[SeriesKey]] = {}
    for key in keys:
        base = peak_source(key)
        if base is not None:
            peaks_of.setdefault(base, []).append(key)
    for key in keys:
        budget = budget_for(key)
        if budget is None or superseded_by(key) in keys:
            continue
        sources = [_times_values(trace, k) for k in (key, *peaks_of.get(key, []))]
        peaks = step_peaks(step_times, sources)
        limit, label = limit_at(trace, budget, step_times[-1])
        series = assemble(budget, steps, step_times, peaks, limit, label=label, plan=plan)
        if series is not None:
            out.append(series)
    return out


def _times_values(trace: Trace, key: SeriesKey) -> tuple[Sequence[float], Sequence[float]]:
    series = trace.series(key.metric, key.device, key.pid)
    if series is None:
        return [], []
    return series.times, series.values


def limit_at(trace: Trace, budget: Budget, t: float) -> tuple[float | None, str]:
    """The budget's limit in force at `t` (else the first recorded), and what it is called;
    the device total where no limit series was recorded."""
    if budget.limit is not None:
        series = trace.series(budget.limit.metric, budget.limit.device, budget.limit.pid)
        if series is not None:
            value = series.at(t)
            if value is None and len(series):
                value = series.values[0]
            if value:
                return value, budget.label
    if budget.total_device is not None:
        return trace.device_total_bytes(budget.total_device), budget.total_label
    return None, budget.label


def _step_number(value: object, index: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else index + 1
