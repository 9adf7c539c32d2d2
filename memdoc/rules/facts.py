"""Facts rules share about a trace: the failing OOM and its stack, devices, the step curve."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from memdoc.kinds import GraphsKept, OomKind
from memdoc.oom.frames import file_name, frame_parts
from memdoc.oom.growthcues import GrowthCues, growth_cues
from memdoc.oom.hostcues import HostCues, host_cues
from memdoc.oom.stackcues import StackCues, stack_cues
from memdoc.oom.textcues import MessageCues, TextCues, message_cues, text_cues
from memdoc.rules.trend import Trend, fit_trend
from memdoc.trace.model import (
    FRAMEWORK_NAMES,
    FRAMEWORK_PREFIXES,
    HANDLED_WHEN_RAISED,
    KERAS,
    UNWATCHED_FRAMEWORK_NAMES,
    Event,
    EventKind,
    Metric,
    OomInfo,
)
from memdoc.trace.model import framework_metric as fw_metric
from memdoc.trace.reader import Series, StepStat, Trace, oom_of
from memdoc.units import MiB

GPU_FRAMEWORKS = tuple(FRAMEWORK_PREFIXES)


@dataclass(frozen=True)
class Failure:
    """The memory error a trace ended with (else its first), and what surrounds it."""

    oom: OomInfo
    t: float
    pid: int | None
    stack: tuple[str, ...] = ()  # "file:line:function", outermost first
    source: tuple[str, ...] = ()  # code lines of a traceback, when an error text showed them
    context: str = ""  # the exception message or log text around the error
    stats: Mapping[str, Any] = field(default_factory=dict)
    live_array_bytes: int | None = None  # what the framework's live arrays held at the error
    # The failing process's own memory at the error, read in-process: `rss_bytes`,
    # `address_space_bytes`, `rlimit_as_bytes` (when a cap is set).
    host: Mapping[str, int] = field(default_factory=dict)
    # JAX: the program's jitted function the error came out of; "" when the call that raised
    # it was no jitted function of the program (an eager operation); None when not known.
    jitted_call: str | None = None
    # JAX: XLA's memory analysis of that call's compiled program, in bytes: `argument`,
    # `output`, `alias` (outputs written into donated arguments), `temp`.
    compiled: Mapping[str, int] = field(default_factory=dict)
    # PyTorch: the module whose forward the error came out of, read from its traceback:
    # `module` (its class), `training`, and for one in evaluation mode `recording_graph`.
    module: Mapping[str, Any] = field(default_factory=dict)
    # PyTorch: the largest module the traceback's frames held (the model in hand): `module`,
    # `param_bytes`, `trainable_bytes` (those that take gradients), `device_type`.
    model: Mapping[str, Any] = field(default_factory=dict)
    # JAX: the bytes of the optimizer's state among the failing jitted call's arguments.
    optimizer_state_bytes: int | None = None

    # What the recogniser reads in the words of the error, the log around it and its code,
    # read once for the failure.

    @cached_property
    def text_cues(self) -> TextCues:
        """What the words say it was doing."""
        return text_cues((self.oom.message, self.context, *self.source))

    @cached_property
    def message_cues(self) -> MessageCues:
        """What the error's own message says beyond its figures."""
        return message_cues(self.oom.message)

    @cached_property
    def growth_cues(self) -> GrowthCues:
        """What the error and the log before it say of memory growing: progress, a leak."""
        return growth_cues(self.oom.message, self.context)

    @cached_property
    def stack_cues(self) -> StackCues:
        """What the frames of its stack say the program was doing."""
        return stack_cues(self.stack)

    @cached_property
    def host_cues(self) -> HostCues:
        """What the words say of the host: a kill, a platform's notice, a build."""
        return host_cues((self.oom.message, self.context, *self.source))


# A request this small fails only on a device that was already all but full.
TINY_REQUEST_BYTES = 4 * 2**20


def tiny_request(oom: OomInfo) -> bool:
    """A failed request so small that what filled the device matters, not the request."""
    return oom.requested_bytes is not None and oom.requested_bytes <= TINY_REQUEST_BYTES


def planned_by_xla(oom: OomInfo) -> bool:
    """An XLA error that shows the compiled program's buffer plan (its working memory)."""
    return bool(oom.xla_buffers or oom.xla_temp_bytes or oom.xla_total_bytes) or (
        oom.kind == OomKind.COMPILE
    )


def innermost_frames(fail: Failure, count: int = 2) -> str:
    """The last frames of the stack, short: "activation.py:143 forward → functional.py:17 relu"."""
    return " → ".join(short_frame(frame) for frame in fail.stack[-count:])


def short_frame(frame: str) -> str:
    """ "train.py:55 evaluate" from "/any/path/train.py:55:evaluate"."""
    file, line, function = frame_parts(frame)
    name = file_name(file)
    return f"{name}:{line} {function}" if line is not None else name


def said(fail: Failure) -> TextCues:
    """What the words of the error, the log around it and its code say it was doing."""
    return fail.text_cues


def message_said(fail: Failure) -> MessageCues:
    """What the error's own message says beyond its figures."""
    return fail.message_cues


def growth_words(fail: Failure) -> GrowthCues:
    """What the error and the log before it say of memory growing: progress, a leak."""
    return fail.growth_cues


def failure(trace: Trace) -> Failure | None:
    """The OOM that ended the run (else the first recorded), with its stack and context."""
    event = trace.ending_oom_event()
    if event is None:
        return None
    oom = oom_of(event)
    if oom is None:
        return None
    exception = _exception_near(trace, event, oom.message)
    stack = _strings(event.data.get("stack")) or (
        _strings(exception.data.get("stack")) if exception else ()
    )
    return Failure(
        oom=oom,
        t=event.t,
        pid=event.pid,
        stack=stack,
        source=_strings(exception.data.get("source")) if exception else (),
        context=str(exception.data.get("message", "")) if exception else "",
        stats=event.data.get("stats") or {},
        live_array_bytes=_live_array_bytes(event),
        host=_host_numbers(event),
        jitted_call=_text_or_none(event.data.get("jitted_call")),
        compiled=_byte_counts(event.data.get("compiled_memory")),
        module=mapping(event.data.get("module_in_hand")),
        model=mapping(event.data.get("model_in_hand")),
        optimizer_state_bytes=_byte_count(event.data.get("optimizer_state_bytes")),
    )


def mapping(value: object) -> dict[str, Any]:
    """A mapping read from a trace, with text keys; {} for anything else."""
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _byte_counts(value: object) -> dict[str, int]:
    """The non-negative whole numbers of a mapping read from a trace; {} for anything else."""
    if not isinstance(value, Mapping):
        return {}
    return {
        str(k): int(v)
        for k, v in value.items()
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0
    }


def _byte_count(value: object) -> int | None:
    """A non-negative whole number read from a trace; None for anything else."""
    return _byte_counts({"value": value}).get("value")


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _host_numbers(event: Event) -> dict[str, int]:
    host = event.data.get("host")
    if not isinstance(host, Mapping):
        return {}
    return {
        str(k): int(v)
        for k, v in host.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    }


def _live_array_bytes(event: Event) -> int | None:
    """Bytes of the live arrays a framework collector listed with the error (JAX)."""
    live = event.data.get("live_arrays")
    held = live.get("bytes") if isinstance(live, Mapping) else None
    return int(held) if isinstance(held, int | float) and not isinstance(held, bool) else None


EXCEPTION_WINDOW_S = 1.0
EXCEPTION_MATCH_CHARS = 120
EXCEPTION_MIN_CHARS = 20


def _exception_near(trace: Trace, oom_event: Event, said: str) -> Event | None:
    """The exception recorded with the OOM: of the same process, the one whose message the
    OOM's repeats (an OOM read from stderr comes when the process has exited, a second or
    more after its exception on a busy machine), else the last within a second."""
    same = [e for e in trace.events(EventKind.EXCEPTION) if e.pid == oom_event.pid]
    told = [e for e in same if _repeats(said, str(e.data.get("message", "")))]
    if told:
        return min(told, key=lambda e: abs(e.t - oom_event.t))
    near = [e for e in same if abs(e.t - oom_event.t) <= EXCEPTION_WINDOW_S]
    return near[-1] if near else None


def _repeats(said: str, message: str) -> bool:
    """The OOM's message holds the start of the exception's (the class name may lead it)."""
    head = message.strip()[:EXCEPTION_MATCH_CHARS]
    return len(head) >= EXCEPTION_MIN_CHARS and head in said


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(str(v) for v in value)


# Libraries an error can name, as people write them.
LIBRARY_NAMES = {
    "cudnn": "cuDNN",
    "cublas": "cuBLAS",
    "nccl": "NCCL",
    "trt": "TensorRT",
    "vllm": "vLLM",
    "rmm": "RMM",
    "cusparse": "cuSPARSE",
    "nvjpeg": "nvJPEG",
}
# Libraries whose handle or workspace lives outside the framework's pool.
OUTSIDE_POOL_LIBRARIES = ("cudnn", "cublas", "nccl")


def specific_library(oom: OomInfo) -> str | None:
    """The library the error names; None for a plain CUDA or allocator failure."""
    return None if oom.library in (None, "cuda", "nvml", "rmm") else oom.library


def starved_library(fail: Failure) -> bool:
    """A library outside the framework's pool found no memory (not a configured limit)."""
    return fail.oom.library in OUTSIDE_POOL_LIBRARIES and not said(fail).workspace_limit


def library_name(oom: OomInfo) -> str:
    """ "cuDNN", "NCCL"... for the library the error names, or "a CUDA allocation"."""
    library = specific_library(oom)
    return LIBRARY_NAMES.get(library or "", library or "a CUDA allocation")


# -- frameworks and devices -----------------------------------------------------------------


def frameworks(trace: Trace, oom: OomInfo | None = None) -> list[str]:
    """GPU frameworks involved: those the program imported, and the one the error names."""
    found = [f for f in trace.frameworks() if f in GPU_FRAMEWORKS]
    if oom is None or oom.framework in found:
        return found
    if oom.framework in GPU_FRAMEWORKS or oom.framework in UNWATCHED_FRAMEWORK_NAMES:
        found.insert(0, oom.framework)
    return found


def failed_device(trace: Trace, oom: OomInfo | None) -> int | None:
    """The device the error names, else the GPU whose memory peaked highest."""
    if oom is not None and oom.device is not None:
        return oom.device
    best: tuple[float, int] | None = None
    for device in trace.devices():
        if device.index < 0:
            continue
        used = device_peak_used(trace, device.index)
        if used is not None and (best is None or used > best[0]):
            best = (used, device.index)
    return best[1] if best else None


def device_total(trace: Trace, device: int | None, oom: OomInfo | None = None) -> int | None:
    """Capacity of the device in bytes, from the error text or the trace."""
    if oom is not None and oom.total_bytes:
        return oom.total_bytes
    if device is None or device < 0:
        return None
    return trace.device_total_bytes(device)


def device_peak_used(trace: Trace, device: int) -> float | None:
    """Highest NVML used bytes of a device, else the highest framework reserved there."""
    used = trace.series(Metric.GPU_USED, device=device)
    if used is not None and (top := used.max()) is not None:
        return top[1]
    reserved = [s.max() for s in trace.framework_series(Metric.RESERVED, device).values()]
    values = [top[1] for top in reserved if top is not None]
    return max(values) if values else None


def sum_at(trace: Trace, metric: str, device: int | None, t: float) -> float | None:
    """Sum over processes of a metric's last value at or before `t` on a device."""
    values = [v for s in trace.series_for(metric, device=device) if (v := s.at(t)) is not None]
    return sum(values) if values else None


def framework_at(trace: Trace, quantity: str, device: int | None, t: float) -> float | None:
    """Sum over frameworks and processes of a framework quantity at `t` on a device."""
    values = [
        v
        for framework in GPU_FRAMEWORKS
        if (v := sum_at(trace, fw_metric(framework, quantity), device, t)) is not None
    ]
    return sum(values) if values else None


def series_named(trace: Trace, metric: str) -> list[Series]:
    """Every series of a metric, whatever its device and process."""
    found = (trace.series(k.metric, k.device, k.pid) for k in trace.series_keys())
    return [s for s in found if s is not None and s.key.metric == metric]


def framework_devices(trace: Trace) -> dict[str, set[int]]:
    """{framework: GPU device indexes it holds memory on} from its recorded series."""
    out: dict[str, set[int]] = {}
    for key in trace.series_keys():
        for framework, prefix in FRAMEWORK_PREFIXES.items():
            if key.metric.startswith(prefix + ".") and key.device is not None and key.device >= 0:
                out.setdefault(framework, set()).add(key.device)
    return out


# -- the memory curve at step boundaries ----------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """One memory series read at step boundaries: what it measures, and per-step stats."""

    label: str
    metric: str
    device: int | None
    pid: int | None
    steps: list[StepStat]

    @property
    def on_host(self) -> bool:
        return self.metric in HOST_CURVE_METRICS


def step_curve(trace: Trace, device: int | None = None) -> Curve | None:
    """Framework allocated memory on `device` (or the busiest GPU); without GPU data, the
    host memory the program owns (`host_curve_metric`)."""
    candidates: list[tuple[str, Series]] = []
    for framework in GPU_FRAMEWORKS:
        metric = fw_metric(framework, Metric.ALLOCATED)
        for key in trace.series_keys():
            if key.metric != metric or key.device is None or key.device < 0:
                continue
            if device is not None and key.device != device:
                continue
            series = trace.series(key.metric, key.device, key.pid)
            if series is not None and len(series):
                candidates.append((framework, series))
    if candidates:
        framework, series = max(candidates, key=lambda c: max(c[1].values))
        key = series.key
        label = f"{framework_name(framework)} allocated on GPU {key.device}"
        return Curve(label, key.metric, key.device, key.pid, trace.per_step(*_key(series)))
    return host_curve(trace)


def host_curve(trace: Trace) -> Curve | None:
    """The host memory at step boundaries, as `host_curve_metric` picks it: the training
    process's own, in a job of several processes sampled on their own of which one reports
    steps (DataLoader workers beside it: the tree's total also moves as they start and end,
    and grows with what they hold); else the process tree's (`job_host_curve`)."""
    training = [curve for stepped, curve in process_curves(trace) if stepped and curve.steps]
    if len(training) == 1 and len(trace.stepping_pids()) == 1:
        return training[0]
    return job_host_curve(trace)


def job_host_curve(trace: Trace) -> Curve | None:
    """The process tree's host memory at step boundaries."""
    host = host_curve_metric(trace)
    if host is None:
        return None
    return Curve(HOST_CURVE_LABELS[host], host, None, None, trace.per_step(host))


# The host memory a curve reads, the program's own first: RSS also counts the file pages a
# program reads through a memory map, which stay resident and grow with every new page read.
HOST_CURVE_METRICS = (Metric.HOST_ANON, Metric.HOST_RSS)
# A trend needs this many steps measured after warm-up; the first WARMUP_STEPS steps
# allocate once (optimizer state, autotuning, caches warming) and are left out.
MIN_TREND_STEPS = 5
WARMUP_STEPS = 2
HOST_CURVE_LABELS = {
    Metric.HOST_ANON: "host memory the program owns",  # resident, without file pages
    Metric.HOST_RSS: "host RSS of the process tree",
}


def host_curve_metric(trace: Trace, pid: int | None = None) -> str | None:
    """The host series that growth is read from: the program's own resident memory where
    the trace has it (recorded since memdoc 0.1 on Linux), else RSS."""
    for metric in HOST_CURVE_METRICS:
        if trace.series(metric, None, pid) is not None:
            return metric
    return None


def rank_curves(trace: Trace) -> list[tuple[int, Curve]]:
    """Each rank's own resident memory at step boundaries, in rank order, when the trace
    holds two ranks or more that were sampled on their own (`memdoc run -- torchrun`)."""
    ranked: dict[int, int] = {}
    for process in trace.processes():
        if process.rank is not None:
            ranked[process.pid] = process.rank  # the latest rank a process reported
    out = []
    for pid, rank in ranked.items():
        metric = host_curve_metric(trace, pid)
        if metric is None:
            continue
        label = (
            f"rank {rank}'s " + ("own " if metric == Metric.HOST_ANON else "") + "resident memory"
        )
        out.append((rank, Curve(label, metric, None, pid, trace.per_step(metric, None, pid))))
    return sorted(out, key=lambda rc: rc[0]) if len({r for r, _ in out}) >= 2 else []


def process_curves(trace: Trace) -> list[tuple[bool, Curve]]:
    """(whether it reported steps, its own host memory at step boundaries) for each process
    of the job sampled on its own, when there are two or more: the processes that train,
    and those beside them (DataLoader workers, a tokenizer's pool, other ranks)."""
    sampled = [
        (process.pid, metric)
        for process in trace.processes(ours=True)
        if (metric := host_curve_metric(trace, process.pid)) is not None
    ]
    if len(sampled) < 2:
        return []  # one process: no per-step reading of it is needed here
    stepping = trace.stepping_pids()
    out = []
    for pid, metric in sampled:
        stepped = pid in stepping
        who = "the training process" if stepped else f"process {pid}"
        label = f"host memory {who} owns" if metric == Metric.HOST_ANON else f"host RSS of {who}"
        out.append((stepped, Curve(label, metric, None, pid, trace.per_step(metric, None, pid))))
    return out


def rank_peaks(trace: Trace) -> dict[int, float]:
    """{rank: the highest memory of its own}, when the trace holds two ranks or more that
    were sampled on their own: the framework's allocated bytes in that process where it
    used a GPU, else its own resident memory (`host_curve_metric`)."""
    ranked = {p.pid: p.rank for p in trace.processes() if p.rank is not None}
    peaks: dict[int, float] = {}
    for pid, rank in ranked.items():
        top = _own_peak(trace, pid)
        if top is not None:
            peaks[rank] = max(top, peaks.get(rank, 0.0))
    return peaks if len(peaks) >= 2 else {}


def _own_peak(trace: Trace, pid: int) -> float | None:
    allocated = [
        top[1]
        for key in trace.series_keys()
        if key.pid == pid and key.metric.endswith("." + Metric.ALLOCATED)
        if (series := trace.series(key.metric, key.device, key.pid)) is not None
        if (top := series.max()) is not None
    ]
    if allocated:
        return max(allocated)
    metric = host_curve_metric(trace, pid)
    series = trace.series(metric, None, pid) if metric is not None else None
    top = series.max() if series is not None else None
    return top[1] if top is not None else None


def root_pid(trace: Trace) -> int | None:
    """The job's first process: the program `memdoc run` started, or the watched process."""
    for process in trace.processes(ours=True):
        if process.ppid == trace.header.pid:
            return process.pid
    return trace.header.pid


def _key(series: Series) -> tuple[str, int | None, int | None]:
    return series.key.metric, series.key.device, series.key.pid


def framework_name(framework: str) -> str:
    if framework == KERAS:
        return "Keras"
    return FRAMEWORK_NAMES.get(framework) or UNWATCHED_FRAMEWORK_NAMES.get(framework, framework)


def framework_names(frameworks: Iterable[str]) -> str:
    """ "PyTorch and TensorFlow": the frameworks as a sentence names them."""
    return " and ".join(framework_name(f) for f in frameworks)


def device_name(device: int | None) -> str:
    if device is None:
        return "the device"
    return "the host" if device < 0 else f"GPU {device}"


@dataclass(frozen=True)
class KeptGraphs:
    """What the recorded backward passes did with their graphs (`autograd` events)."""

    site: str  # the program's line whose backward first kept its graph (retain_graph=True)
    freed: bool  # a later backward freed a graph: retaining was for a second pass


def kept_graphs(trace: Trace) -> KeptGraphs | None:
    """How the program's backward passes kept their graphs, where memdoc saw one keep it."""
    site: str | None = None
    freed = False
    for event in trace.events(EventKind.AUTOGRAD):
        if site is None and GraphsKept.RETAINED in event.data:
            site = str(event.data[GraphsKept.RETAINED] or "")
        elif site is not None and event.data.get(GraphsKept.FREED):
            freed = True
    return KeptGraphs(site, freed) if site is not None else None


def baselines(steps: Iterable[StepStat]) -> list[float]:
    return [s.baseline for s in steps if s.baseline is not None]


# Growth must be both relative and absolute: a few KiB per step on a small baseline is noise.
MIN_RELATIVE_GROWTH = 0.10
MIN_GROWTH_BYTES = {True: 32 * MiB, False: 4 * MiB}  # host RSS is noisier than an allocator
MIN_MONOTONIC = 0.7
# A leak adds memory in most steps, not in one jump.
MIN_RISING = 0.5
# Memory counts as held once it is within this share of the level the run ended at. Read at
# every step, a leak behind a retry at a smaller batch fills the memory, then holds it for
# a dozen steps while the retries reuse what the failed attempts freed (a halve-on-OOM
# loop keeping each step's logits: 20 steps of 15-31 MiB, then 17 steps within 2%).
HELD_SHARE = 0.95


def baseline_trend(
    trace: Trace, curve: Curve, *, warmup: int | None = None, min_steps: int = MIN_TREND_STEPS
) -> tuple[Trend, float] | None:
    """The curve's trend at step boundaries after warm-up, and its last value: the one
    growth rate of a run, quoted alike by the findings and the per-step table. None with
    fewer than `min_steps` steps measured after warm-up.

    The warm-up is WARMUP_STEPS, fewer where that would leave under MIN_TREND_STEPS;
    `warmup` given (a test's memory budget) leaves out exactly that many steps."""
    measured = after_warmup(measured_baselines(trace, curve), warmup)
    if len(measured) < min_steps:
        return None
    values = [value for _, value in measured]
    positions = [step for step, _ in measured]
    trend = fit_trend(values, tolerance=_noise(curve, values), positions=positions)
    return (trend, values[-1]) if trend is not None else None


def filling_trend(
    trace: Trace, curve: Curve, *, held_share: float, min_steps: int = MIN_TREND_STEPS
) -> tuple[Trend, float, int] | None:
    """The trend of the steps that filled the memory a run ended with: after warm-up, up to
    the first step within `held_share` of the last value; that last value; and the steps
    the memory was then held for. For memory that grew and was then held until the run
    ended (a retry at a smaller batch reuses what the failed one freed). None with fewer
    than `min_steps` such steps."""
    measured = after_warmup(measured_baselines(trace, curve))
    if not measured:
        return None
    last = measured[-1][1]
    filled = next(i for i, (_, value) in enumerate(measured) if value >= held_share * last)
    part = measured[: filled + 1]
    if len(part) < min_steps:
        return None
    values = [value for _, value in part]
    trend = fit_trend(values, tolerance=_noise(curve, values), positions=[step for step, _ in part])
    held_for = measured[-1][0] - part[-1][0]
    return (trend, last, held_for) if trend is not None else None


def steady_growth(
    trace: Trace, curve: Curve, fail: Failure | None
) -> tuple[Trend, float, int] | None:
    """The run's growth at step boundaries, where it lasts: the curve's trend after warm-up,
    its last value and 0, when it grows;
    or, for a run that ran out, the trend of the steps that filled the memory it ran out
    with, when those grew and it was then held to the end."""
    fitted = baseline_trend(trace, curve)
    if fitted is None:
        return None
    if grows_steadily(fitted[0], curve):
        return (*fitted, 0)
    if fail is None or trained_after(curve, fail):
        return None  # no failure ended the steps that filled the memory
    filling = filling_trend(trace, curve, held_share=HELD_SHARE)
    return filling if filling is not None and grows_steadily(filling[0], curve) else None


def trained_after(curve: Curve, fail: Failure) -> bool:
    """A step of the curve began after the failure: the program caught it and went on (a
    batch-size finder's try), so the failure ended nothing that these steps did."""
    return any(step.t_start >= fail.t for step in curve.steps)


def grows_steadily(trend: Trend, curve: Curve) -> bool:
    """Growth that lasts: a robust slope, in absolute and relative terms, in most steps."""
    return (
        trend.robust_slope_per_step > 0
        and trend.robust_growth >= MIN_GROWTH_BYTES[curve.on_host]
        and trend.robust_growth >= MIN_RELATIVE_GROWTH * trend.start
        and trend.monotonic_fraction >= MIN_MONOTONIC
        and trend.rising_fraction >= MIN_RISING
    )


def _noise(curve: Curve, values: list[float]) -> float:
    """How far a baseline may drop between steps and still count as flat."""
    if not curve.on_host:
        return 0.0
    return max(1 * MiB, 0.002 * max(values))


def after_warmup(
    measured: list[tuple[int, float]], warmup: int | None = None
) -> list[tuple[int, float]]:
    """The (step index, baseline) pairs after the first `warmup` steps (None: WARMUP_STEPS,
    fewer where that would leave under MIN_TREND_STEPS)."""
    if warmup is None:
        # The first steps allocate once (optimizer state, caches, autotuning): a jump there
        # followed by a plateau is warm-up, not a leak.
        warmup = min(WARMUP_STEPS, max(0, len(measured) - MIN_TREND_STEPS))
    return [(step, value) for step, value in measured if step >= warmup]


def measured_baselines(trace: Trace, curve: Curve) -> list[tuple[int, float]]:
    """(step index, baseline) of the steps read at their boundary, and of those after
    which the curve was sampled again.

    Steps shorter than the sampling interval share one sample: repeating it would read as
    "no growth" where nothing was measured.
    """
    series = trace.series(curve.metric, curve.device, curve.pid)
    out: list[tuple[int, float]] = []
    last_sample = -1
    for index, step in enumerate(curve.steps):
        sample = bisect.bisect_right(series.times, step.t_end + 1e-9) if series else index
        if step.baseline is not None and (step.exact or sample != last_sample):
            out.append((index, step.baseline))
            last_sample = sample
    return out


def handled_when_raised(trace: Trace, fail: Failure) -> list[OomInfo]:
    """The memory errors the failing process was still handling when it raised `fail`'s
    (a retry inside an `except` block), oldest first: each one's traceback kept its frames,
    and what they held, alive through the retries after it."""
    earlier = []
    for event in trace.oom_events():
        if event.pid != fail.pid or event.t > fail.t or not event.data.get(HANDLED_WHEN_RAISED):
            continue
        oom = oom_of(event)
        if oom is not None:
            earlier.append(oom)
    return earlier
