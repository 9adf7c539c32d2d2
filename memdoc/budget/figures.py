"""The figures a memory budget is kept on: for each device of a run and for the host, the
peak held and used, the highest per-step peak, the steady growth per step, the peak per loop
phase, and the step that reached the peak; with the findings, and what the run was.

One set of figures serves `memdoc compare`, its saved baselines and the pytest plugin, so a
budget means the same number wherever it is checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memdoc.rules.facts import (
    GPU_FRAMEWORKS,
    Curve,
    baseline_trend,
    framework_name,
    host_curve,
    measured_baselines,
    step_curve,
)
from memdoc.trace.model import Metric
from memdoc.trace.model import framework_metric as fw_metric
from memdoc.trace.phases import phases
from memdoc.trace.reader import Series, Trace, peak_metric, sum_series

# The baseline file's format: {"memdoc_baseline": BASELINE_FORMAT, ...}.
BASELINE_FORMAT = 1
HOST = "host"

# Figure names, in the order tables show them. Bytes, except PEAK_STEP (a step number).
PEAK_HELD = "peak_held"
PEAK_USED = "peak_used"
FRAMEWORK_USED = "framework_used"
STEP_PEAK = "step_peak"
GROWTH_PER_STEP = "growth_per_step"
PEAK_STEP = "peak_step"
PHASE_PREFIX = "phase_peak."
FIGURE_ORDER = (PEAK_HELD, PEAK_USED, FRAMEWORK_USED, STEP_PEAK, GROWTH_PER_STEP, PEAK_STEP)
# What each figure is, in the words tables use (a phase's peak: "peak in eval").
FIGURE_WORDS = {
    PEAK_HELD: "peak held",
    PEAK_USED: "peak used",
    FRAMEWORK_USED: "framework allocator peak",
    STEP_PEAK: "highest per-step peak",
    GROWTH_PER_STEP: "growth per step",
    PEAK_STEP: "step of the peak",
}
# What held and used mean in each place.
PLACE_WORDS = {
    "gpu": {PEAK_HELD: "reserved by the framework's pool", PEAK_USED: "allocated to tensors"},
    HOST: {PEAK_HELD: "resident (RSS)", PEAK_USED: "the program's own (anonymous) memory"},
}


HOST_SOURCES = {
    PEAK_HELD: "RSS of the process tree",
    PEAK_USED: "host memory the program owns (anonymous, of the process tree)",
}


def figure_words(name: str) -> str:
    if name.startswith(PHASE_PREFIX):
        return f"peak in {name.removeprefix(PHASE_PREFIX)}"
    return FIGURE_WORDS.get(name, name)


def is_bytes(name: str) -> bool:
    return name != PEAK_STEP


@dataclass(frozen=True)
class Place:
    """One device of a run (`gpu0`, ...) or the host, and its figures (None: not measured)."""

    name: str
    label: str  # "GPU 0 (NVIDIA H100 80GB HBM3)", "host"
    device_name: str | None = None  # what the driver calls the GPU, for like-with-like
    figures: Mapping[str, float | None] = field(default_factory=dict)
    # Where a figure comes from ("PyTorch allocated", "host memory the program owns").
    sources: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "device_name": self.device_name,
            "figures": {k: _rounded(v) for k, v in self.figures.items()},
            "sources": dict(self.sources),
        }

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> Place:
        figures = data.get("figures")
        sources = data.get("sources")
        return cls(
            name=name,
            label=str(data.get("label") or name),
            device_name=_text_or_none(data.get("device_name")),
            figures={
                str(k): _number_or_none(v)
                for k, v in (figures.items() if isinstance(figures, Mapping) else ())
            },
            sources={
                str(k): str(v) for k, v in (sources.items() if isinstance(sources, Mapping) else ())
            },
        )


@dataclass(frozen=True)
class FoundCause:
    rule: str
    title: str
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": self.title, "confidence": round(self.confidence, 2)}


@dataclass(frozen=True)
class Figures:
    """A run's budget figures: what it ran, where, and what it needed."""

    program: str  # the script or module the run ran, as a person names it
    command: tuple[str, ...]
    frameworks: tuple[str, ...]
    steps: int
    places: Mapping[str, Place]
    findings: tuple[FoundCause, ...] = ()
    ended: str = ""  # "ok", "oom", ... (see the report's Ending)
    source: str = ""  # the trace, folder or baseline file it was read from

    def place(self, name: str) -> Place | None:
        return self.places.get(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "memdoc_baseline": BASELINE_FORMAT,
            "program": self.program,
            "command": list(self.command),
            "frameworks": list(self.frameworks),
            "steps": self.steps,
            "ended": self.ended,
            "places": {name: place.to_dict() for name, place in self.places.items()},
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "") -> Figures:
        """Figures saved by `to_dict`; ValueError when `data` is not such a file."""
        if data.get("memdoc_baseline") != BASELINE_FORMAT:
            raise ValueError("not a memdoc baseline (no memdoc_baseline: 1)")
        places = data.get("places")
        if not isinstance(places, Mapping):
            raise ValueError("a memdoc baseline without places")
        findings = data.get("findings")
        steps = data.get("steps")
        return cls(
            program=str(data.get("program") or ""),
            command=tuple(str(a) for a in _list(data.get("command"))),
            frameworks=tuple(str(f) for f in _list(data.get("frameworks"))),
            steps=steps if isinstance(steps, int) and not isinstance(steps, bool) else 0,
            places={
                str(name): Place.from_dict(str(name), place)
                for name, place in places.items()
                if isinstance(place, Mapping)
            },
            findings=tuple(
                FoundCause(str(f.get("rule", "")), str(f.get("title", "")), _confidence(f))
                for f in _list(findings)
                if isinstance(f, Mapping)
            ),
            ended=str(data.get("ended") or ""),
            source=source,
        )


def run_figures(
    traces: Sequence[Trace],
    findings: Iterable[Any] = (),
    *,
    ended: str = "",
    source: str = "",
) -> Figures:
    """The figures of a run (its first trace is the primary one; ranks add their devices)."""
    primary = traces[0]
    places: dict[str, Place] = {}
    for trace in traces:
        for place in trace_places(trace):
            places.setdefault(place.name, place)
    return Figures(
        program=program_name(primary.header.command),
        command=tuple(primary.header.command),
        frameworks=tuple(primary.frameworks()),
        steps=len(primary.steps()),
        places=places,
        findings=tuple(
            FoundCause(f.rule, f.title, float(f.confidence))
            for f in findings
            if getattr(f, "rule", None)
        ),
        ended=ended,
        source=source,
    )


def trace_places(trace: Trace) -> list[Place]:
    """Each GPU the frameworks or the driver saw in this trace, then the host."""
    places = [_gpu_place(trace, device) for device in _gpu_indices(trace)]
    places.append(_host_place(trace))
    return places


# -- the devices ---------------------------------------------------------------------------


def _gpu_indices(trace: Trace) -> list[int]:
    found = {
        key.device
        for key in trace.series_keys()
        if key.device is not None and key.device >= 0 and _is_device_memory(key.metric)
    }
    return sorted(found)


def _is_device_memory(metric: str) -> bool:
    quantity = metric.rsplit(".", 1)[-1]
    return quantity in (Metric.ALLOCATED, Metric.RESERVED) or metric == Metric.GPU_PROC_USED


def _gpu_place(trace: Trace, device: int) -> Place:
    figures: dict[str, float | None] = {}
    sources: dict[str, str] = {}
    for figure, quantity in ((PEAK_HELD, Metric.RESERVED), (PEAK_USED, Metric.ALLOCATED)):
        found = _framework_peak(trace, quantity, device)
        if found is not None:
            figures[figure], sources[figure] = found
    if PEAK_HELD not in figures:  # a framework without a pool figure: the driver's view
        driver = _peak_of(_own_driver_series(trace, device))
        if driver is not None:
            figures[PEAK_HELD] = driver
            sources[PEAK_HELD] = "the driver's per-process figure (NVML)"
    curve = step_curve(trace, device)
    if curve is not None and curve.device == device:
        _curve_figures(trace, curve, figures, sources)
    name = next((d.name for d in trace.devices() if d.index == device), None)
    label = f"GPU {device}" + (f" ({name})" if name else "")
    return Place(f"gpu{device}", label, name, figures, sources)


def _framework_peak(trace: Trace, quantity: str, device: int) -> tuple[float, str] | None:
    best: tuple[float, str] | None = None
    for framework in GPU_FRAMEWORKS:
        peak = _peak_of(_series_with_peaks(trace, fw_metric(framework, quantity), device))
        if peak is not None and (best is None or peak > best[0]):
            best = (peak, f"{framework_name(framework)} {quantity}")
    return best


def _own_driver_series(trace: Trace, device: int) -> list[Series]:
    ours = trace.our_pids()
    return [s for s in trace.series_for(Metric.GPU_PROC_USED, device=device) if s.key.pid in ours]


# -- the host ------------------------------------------------------------------------------


def _host_place(trace: Trace) -> Place:
    figures: dict[str, float | None] = {}
    sources: dict[str, str] = {}
    for figure, metric in ((PEAK_HELD, Metric.HOST_RSS), (PEAK_USED, Metric.HOST_ANON)):
        series = trace.series(metric)
        peak = _peak_of([series] if series is not None else [])
        if peak is not None:
            figures[figure] = peak
            sources[figure] = HOST_SOURCES[figure]
    framework = _framework_peak(trace, Metric.ALLOCATED, -1)
    if framework is not None:  # JAX's live arrays, TensorFlow's CPU allocator
        figures[FRAMEWORK_USED], sources[FRAMEWORK_USED] = framework
    curve = host_curve(trace)
    if curve is not None:
        _curve_figures(trace, curve, figures, sources)
    return Place(HOST, "host", None, figures, sources)


# -- from the step curve -------------------------------------------------------------------


def _curve_figures(
    trace: Trace, curve: Curve, figures: dict[str, float | None], sources: dict[str, str]
) -> None:
    """The per-step peak, the growth per step, the peak's step and the phases' peaks, all
    from the one curve the rules read growth from (so a budget and a finding agree)."""
    peaks = [s.peak for s in curve.steps if s.peak is not None]
    if peaks:
        figures[STEP_PEAK] = max(peaks)
        best = max((s for s in curve.steps if s.peak is not None), key=lambda s: s.peak or 0.0)
        figures[PEAK_STEP] = best.step
        sources[STEP_PEAK] = sources[PEAK_STEP] = curve.label
    if measured_baselines(trace, curve):
        trend = baseline_trend(trace, curve)
        # The rate the per-step tables quote; too few steps measured after warm-up: not
        # measured, rather than 0.
        figures[GROWTH_PER_STEP] = trend[0].robust_slope_per_step if trend is not None else None
        sources[GROWTH_PER_STEP] = curve.label
    series = _curve_series(trace, curve)
    if series is None:
        return
    for phase in phases(trace):
        peak = series.max_between(phase.t0, phase.t1)
        if peak is None:
            continue
        key = PHASE_PREFIX + phase.name
        previous = figures.get(key)
        figures[key] = peak if previous is None else max(previous, peak)
        sources[key] = curve.label


def _curve_series(trace: Trace, curve: Curve) -> Series | None:
    return trace.series(curve.metric, curve.device, curve.pid)


# -- small readers -------------------------------------------------------------------------


def _series_with_peaks(trace: Trace, metric: str, device: int) -> list[Series]:
    """The series of `metric` on `device` of every process, and its interval peaks."""
    found = trace.series_for(metric, device=device)
    peaks = trace.series_for(peak_metric(metric), device=device)
    if len(found) > 1:
        # Several processes on one device: their sum at each instant is what the device held.
        return [sum_series(found), *([sum_series(peaks)] if peaks else [])]
    return [*found, *peaks]


def _peak_of(series: Iterable[Series]) -> float | None:
    best = [m[1] for s in series if (m := s.max()) is not None]
    return max(best) if best else None


def program_name(command: Sequence[str]) -> str:
    """The script or module a command ran: "train.py", "-m pkg.train"; the command's first
    word when neither shows."""
    words = list(command)
    for index, word in enumerate(words):
        if word == "-m" and index + 1 < len(words):
            return f"-m {words[index + 1]}"
        if word.endswith(".py"):
            return word.rsplit("/", 1)[-1]
    return words[0].rsplit("/", 1)[-1] if words else ""


def _rounded(value: float | None) -> float | int | None:
    if value is None:
        return None
    return round(value) if abs(value) >= 1 else round(value, 6)


def _number_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _confidence(data: Mapping[str, Any]) -> float:
    value = _number_or_none(data.get("confidence"))
    return value if value is not None else 0.0
