"""A test's memory against the limits its `@pytest.mark.memdoc(...)` marker sets: what the
test added over what the process held when it began, the steady growth per step after
warm-up, and the words that say why when it needs more than its budget.

The pytest plugin (memdoc.integrations.pytest_plugin) records each marked test with
`memdoc.watch` and asks this module for the verdict; the figures come from the same trace
readers as `memdoc.budget.figures`, so a budget means the same number in a test as in
`memdoc compare`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memdoc.budget.compare import Limit, parse_limit
from memdoc.budget.figures import GROWTH_PER_STEP, PEAK_HELD
from memdoc.collectors.own import trim_heap
from memdoc.rules.facts import (
    Curve,
    after_warmup,
    baseline_trend,
    framework_name,
    host_curve_metric,
    measured_baselines,
    step_curve,
)
from memdoc.trace.model import FRAMEWORK_PREFIXES, Metric
from memdoc.trace.reader import Series, Trace, peak_metric
from memdoc.units import MiB, format_bytes, parse_size

# The marker's arguments, in the order a positional argument fills them (`peak_held` and
# `growth_per_step` are the figures of those names).
PEAK = "peak"
WARMUP = "warmup"
TOLERANCE = "tolerance"
ARGUMENTS = (PEAK, PEAK_HELD, GROWTH_PER_STEP, WARMUP, TOLERANCE)
DEFAULT_WARMUP = 2
# Growth is judged on at least this many steps measured after warm-up.
MIN_GROWTH_STEPS = 3
# How many lines of a fix's code the failure message shows.
FIX_LINES = 3


@dataclass(frozen=True)
class Limits:
    """What one marked test may need; None: not budgeted."""

    peak: int | None = None
    peak_held: int | None = None
    growth_per_step: int | None = None
    warmup: int = DEFAULT_WARMUP
    tolerance: Limit | None = None  # None: exact on allocator counters, host noise on the host

    @property
    def empty(self) -> bool:
        return self.peak is None and self.peak_held is None and self.growth_per_step is None


def parse_limits(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Limits:
    """The marker's arguments as limits; ValueError with one line naming the argument."""
    if len(args) > len(ARGUMENTS):
        raise ValueError(f"memdoc marker: at most {len(ARGUMENTS)} arguments, got {len(args)}")
    given = dict(zip(ARGUMENTS, args, strict=False))
    for name, value in kwargs.items():
        if name not in ARGUMENTS:
            raise ValueError(
                f"memdoc marker: no argument called {name!r} (the arguments: "
                + ", ".join(ARGUMENTS)
                + ")"
            )
        if name in given:
            raise ValueError(f"memdoc marker: {name} given twice")
        given[name] = value
    warmup = given.get(WARMUP, DEFAULT_WARMUP)
    if warmup is None:
        warmup = DEFAULT_WARMUP
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"memdoc marker: warmup={warmup!r} is not a number of steps (0 or more)")
    return Limits(
        peak=_size(PEAK, given.get(PEAK)),
        peak_held=_size(PEAK_HELD, given.get(PEAK_HELD)),
        growth_per_step=_size(GROWTH_PER_STEP, given.get(GROWTH_PER_STEP)),
        warmup=warmup,
        tolerance=_tolerance(given.get(TOLERANCE)),
    )


def _size(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        parsed = parse_size(value)
        if parsed is not None:
            return parsed
    elif (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    ):
        return round(value)
    raise ValueError(
        f'memdoc marker: {name}={value!r} is not a size (try "1.5 GiB", "64MiB" or bytes)'
    )


def _tolerance(value: object) -> Limit | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = f"{value!r}"
    if isinstance(value, str):
        try:
            return parse_limit(value)
        except ValueError:
            pass
    raise ValueError(
        f'memdoc marker: tolerance={value!r} is not a size or a share (try "5%" or "8 MiB")'
    )


# -- what a test needed --------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """What a test needed in the place it ran (a GPU, else the host).

    `*_start`: the value when the test began; `*_top`: the highest during it. On a device
    the figures are the framework allocator's counters (exact, with the interval peaks
    between samples); on the host they are sampled process memory.
    """

    place: str  # "gpu0", "host"
    where: str  # "GPU 0", "host"
    used_words: str  # "PyTorch allocated", "the program's own memory (anonymous)"
    held_words: str
    exact: bool  # allocator counters: compared without a tolerance
    used_start: float | None = None
    used_top: float | None = None
    held_start: float | None = None
    held_top: float | None = None
    steps: int = 0  # steps memdoc counted in the test
    growth_steps: int = 0  # steps measured after warm-up
    growth_span: float = 0.0  # steps from the first to the last of those
    growth_per_step: float | None = None

    @property
    def peak(self) -> float | None:
        """What the test added to the used figure at its highest."""
        return _added(self.used_start, self.used_top)

    @property
    def peak_held(self) -> float | None:
        return _added(self.held_start, self.held_top)


def _added(start: float | None, top: float | None) -> float | None:
    if start is None or top is None:
        return None
    return max(top - start, 0.0)


HOST_USED_WORDS = {
    Metric.HOST_ANON: "the program's own memory (anonymous)",
    Metric.HOST_RSS: "resident memory (RSS)",
}


def measure(trace: Trace, warmup: int = DEFAULT_WARMUP) -> Measured:
    """What the test recorded in `trace` needed: on the GPU whose framework allocated most,
    else on the host (the process tree's own memory)."""
    curve = step_curve(trace)
    if curve is not None and curve.device is not None and curve.device >= 0:
        measured = _on_device(trace, curve)
    else:
        measured = _on_host(trace, curve)
    steps = len(trace.steps())
    if curve is None:
        return _with(measured, steps=steps)
    after = after_warmup(measured_baselines(trace, curve), warmup)
    trend = baseline_trend(trace, curve, warmup=warmup, min_steps=MIN_GROWTH_STEPS)
    return _with(
        measured,
        steps=steps,
        growth_steps=len(after),
        growth_span=trend[0].span_steps if trend is not None else 0.0,
        growth_per_step=trend[0].robust_slope_per_step if trend is not None else None,
    )


def _with(measured: Measured, **changes: Any) -> Measured:
    from dataclasses import replace

    return replace(measured, **changes)


def _on_device(trace: Trace, curve: Curve) -> Measured:
    device = curve.device if curve.device is not None else 0
    framework = _framework_of(curve.metric)
    used = trace.series(curve.metric, device, curve.pid)
    held_metric = curve.metric.rsplit(".", 1)[0] + "." + Metric.RESERVED
    held = trace.series(held_metric, device, curve.pid)
    name = framework_name(framework)
    return Measured(
        place=f"gpu{device}",
        where=f"GPU {device}",
        used_words=f"{name} allocated",
        held_words=f"{name} reserved",
        exact=True,
        used_start=_first(used),
        used_top=_top(used, trace.series(peak_metric(curve.metric), device, curve.pid)),
        held_start=_first(held),
        held_top=_top(held, trace.series(peak_metric(held_metric), device, curve.pid)),
    )


def _on_host(trace: Trace, curve: Curve | None) -> Measured:
    metric = curve.metric if curve is not None else host_curve_metric(trace) or Metric.HOST_RSS
    used = trace.series(metric)
    held = trace.series(Metric.HOST_RSS)
    return Measured(
        place="host",
        where="host",
        used_words=HOST_USED_WORDS.get(metric, metric),
        held_words=HOST_USED_WORDS[Metric.HOST_RSS],
        exact=False,
        used_start=_first(used),
        used_top=_top(used, None),
        held_start=_first(held),
        held_top=_top(held, None),
    )


def _framework_of(metric: str) -> str:
    prefix = metric.split(".", 1)[0]
    return next((f for f, p in FRAMEWORK_PREFIXES.items() if p == prefix), prefix)


def _first(series: Series | None) -> float | None:
    return series.values[0] if series is not None and len(series) else None


def _top(series: Series | None, peaks: Series | None) -> float | None:
    """The highest value of `series`, and of the interval peaks after its first sample: the
    first interval peak is the counter's all-time peak, earlier tests' included (memdoc
    never resets a framework's peak counter)."""
    if series is None or not len(series):
        return None
    top = max(series.values)
    if peaks is not None:
        later = [v for t, v in zip(peaks.times, peaks.values, strict=True) if t > series.times[0]]
        if later:
            top = max(top, *later)
    return top


def return_freed_heap() -> bool:
    """Hand the C heap's freed pages back to the system, before a test is measured on the
    host: memory earlier tests freed but the heap kept would otherwise take the test's
    allocations without the process's own memory growing, and hide its peak and a leak
    until it ran out. What the program holds, and any figure it reads from its framework,
    stay as they were. False where there is no glibc."""
    return trim_heap()


# -- the verdict ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Excess:
    """One limit the test went over, in one line."""

    figure: str  # PEAK, PEAK_HELD, GROWTH_PER_STEP
    line: str


@dataclass(frozen=True)
class Verdict:
    measured: Measured
    limits: Limits
    over: tuple[Excess, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)  # what could not be judged

    @property
    def passed(self) -> bool:
        return not self.over


def judge(measured: Measured, limits: Limits) -> Verdict:
    """The limits `measured` went over, each in a line with the numbers against the budget."""
    over: list[Excess] = []
    for figure, budget, value, start, words in (
        (PEAK, limits.peak, measured.peak, measured.used_start, measured.used_words),
        (PEAK_HELD, limits.peak_held, measured.peak_held, measured.held_start, measured.held_words),
    ):
        if budget is None:
            continue
        if value is None:
            over.append(Excess(figure, f"{figure}: not measured ({words} was not recorded)"))
            continue
        allowed = tolerance_of(measured, limits, budget)
        if value > budget + allowed:
            over.append(
                Excess(
                    figure,
                    f"{figure} {format_bytes(value)} over the {format_bytes(start)} held "
                    f"when the test began, budget {format_bytes(budget)}"
                    + _tolerance_words(allowed, measured),
                )
            )
    if limits.growth_per_step is not None:
        growth = _growth_excess(measured, limits, limits.growth_per_step)
        if growth is not None:
            over.append(growth)
    return Verdict(measured, limits, tuple(over))


# How far a sampled host figure may go over its budget and still pass, by default: the
# host's figures move a little between runs of one test (the allocator, the page cache).
HOST_NOISE_SHARE = 0.02
HOST_NOISE_BYTES = 1 << 20
# The host's noise, measured: one small PyTorch test (a 512-1024-512 MLP, Adam, batch 256,
# 20 steps; growth budget 0 B) run 20 times in one pytest process (10 ms sampling, 2
# cores, some runs under load). Without `return_freed_heap`, five such sessions: what each
# run added at its peak spread from 0 B to 30 MiB (heap freed by earlier tests took its
# tensors unseen). With it, 20 runs: 30.1 to 37.5 MiB (the first, cold one of a process
# 105 MiB), so a peak budget keeps the default max(1 MiB, 2% of the budget) and a test
# near its budget may set `tolerance=`. Growth over the 17 steps after warm-up spread from
# -7.2 MiB to +9.2 MiB over all 120 runs: a baseline sampled while a step's 2 MiB
# temporaries lived, or the heap grown by one of them, moves the robust slope by a jump's
# worth. Hence growth on the host passes up to max(16 MiB, 2% of the test's peak) beyond
# its budget: a leak of 1 MiB a step fails after some 20 steps; a smaller one needs more
# steps, or `tolerance=`.
# Measured again once each step boundary read the process's own memory: a jitted JAX step
# and a Keras fit that keep nothing (30 steps, 2 MiB temporaries a step; growth over the 27
# steps after warm-up), 20 runs each in one process: up to 19.3 MiB (JAX) and 13.9 MiB
# (Keras), the C heap keeping freed temporaries in its per-thread arenas; once at 21.3 MiB
# in a full test suite beside another. With the heap's freed pages returned before each
# step's reading (`Session.trim_heap_at_steps`, on under a growth budget), 60 runs each,
# three sessions at once on 2 cores: -6.0 to +6.0 MiB (JAX), -0.6 to +0.5 MiB (Keras). The
# 16 MiB floor keeps well above both.
HOST_GROWTH_NOISE_BYTES = 16 * MiB


def tolerance_of(
    measured: Measured, limits: Limits, reference: float, floor: float = HOST_NOISE_BYTES
) -> float:
    """How far over `reference` a figure may go and still pass: nothing on an allocator's
    counters, the host's noise (max(floor, 2% of `reference`)) on sampled host memory;
    the marker's `tolerance` where given."""
    if limits.tolerance is not None:
        return limits.tolerance.allowance(reference)
    if measured.exact:
        return 0.0
    return max(float(floor), HOST_NOISE_SHARE * abs(reference))


def _growth_excess(measured: Measured, limits: Limits, budget: int) -> Excess | None:
    count = measured.growth_steps
    if measured.growth_per_step is None or count < MIN_GROWTH_STEPS:
        return Excess(GROWTH_PER_STEP, f"too few steps to judge growth ({count})")
    span = measured.growth_span
    added = (measured.growth_per_step - budget) * span
    # Growth beyond the budget over the steps after warm-up, against the noise of the
    # test's own peak (what it added; the marker's tolerance where given).
    allowed = tolerance_of(measured, limits, measured.peak or 0.0, HOST_GROWTH_NOISE_BYTES)
    if added <= allowed:
        return None
    return Excess(
        GROWTH_PER_STEP,
        f"growth_per_step {format_bytes(measured.growth_per_step)} over a budget of "
        f"{format_bytes(budget)}: {format_bytes(added)} more over {span:g} steps after "
        f"{limits.warmup} warm-up step{'s' if limits.warmup != 1 else ''}"
        + _tolerance_words(allowed, measured),
    )


def _tolerance_words(allowed: float, measured: Measured) -> str:
    if allowed > 0:
        return f" (+{format_bytes(allowed)} tolerance)"
    return " (allocator counters: exact)" if measured.exact else ""


# -- in words ------------------------------------------------------------------------------


def failure_message(
    verdict: Verdict,
    findings: Sequence[Any] = (),
    trace_path: str | None = None,
) -> str:
    """The verdict for a test's report: what went over, where, the steps counted, memdoc's
    top finding with its first fix, and the trace when it is kept."""
    m = verdict.measured
    lines = [f"memdoc: {excess.line}" for excess in verdict.over]
    lines.append(
        f"  where: {m.where}, {m.used_words}; {m.steps} step{'s' if m.steps != 1 else ''} "
        f"counted"
        + (
            f", {m.growth_steps} measured after warm-up"
            if verdict.limits.growth_per_step is not None
            else ""
        )
    )
    finding = findings[0] if findings else None
    if finding is not None:
        lines.append(f"  why: {finding.title}: {finding.summary}")
        fix = _first_fix(finding, on_gpu=m.exact)
        if fix is not None:
            code = [line for line in str(fix.code).splitlines() if line.strip()]
            shown = code[:FIX_LINES] + (["..."] if len(code) > FIX_LINES else [])
            lines.append(f"  fix: {fix.title}")
            lines.extend(f"      {line}" for line in shown)
    if trace_path:
        lines.append(f"  trace: {trace_path} (memdoc report {trace_path})")
    return "\n".join(lines)


def _first_fix(finding: Any, *, on_gpu: bool) -> Any:
    fixes = [
        f for f in getattr(finding, "fixes", ()) if on_gpu or not getattr(f, "gpu_only", False)
    ]
    return fixes[0] if fixes else None


def summary_row(verdict: Verdict) -> dict[str, Any]:
    """A test's figures and verdict, plain values (they cross from a pytest-xdist worker)."""
    m = verdict.measured
    return {
        "where": m.where,
        "peak": m.peak,
        "peak_held": m.peak_held,
        "growth_per_step": m.growth_per_step,
        "steps": m.steps,
        "verdict": "ok" if verdict.passed else "over: " + ", ".join(e.figure for e in verdict.over),
    }
