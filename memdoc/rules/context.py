"""What a rule is given: one trace, read-only, and the named questions it answers.

The engine makes one `Facts` for each trace it diagnoses and hands it to every rule, so a
question two rules ask (the failure, the step curve, what the program held) is answered
once. Rules read the trace through it and never change it.

The answers come from the functions of `memdoc.rules.facts` and `memdoc.rules.host`, which
the report and the dashboard also call on a trace of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from memdoc.rules import facts as _facts
from memdoc.rules import host as _host
from memdoc.rules.facts import Curve, Failure, KeptGraphs
from memdoc.rules.host import Counted, Held, Limit
from memdoc.rules.trend import Trend
from memdoc.trace.model import OomInfo
from memdoc.trace.phases import BatchSearch, Phase, batch_search, phase_at, phases
from memdoc.trace.reader import Series, Trace

_T = TypeVar("_T")


@dataclass(frozen=True)
class ProcessGrowth:
    """Whose own memory grew step after step in a job of several processes: whether a
    process that reports steps did, and (curve, trend) of each process beside them that did."""

    training_grew: bool
    beside: list[tuple[Curve, Trend]]


@dataclass(frozen=True, eq=False)
class Facts:
    """The named questions rules ask of one trace. The trace must not change while rules
    read it: the engine diagnoses a trace that is complete, or a copy of a live one."""

    trace: Trace
    _answers: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    def _once(self, key: tuple[object, ...], answer: Callable[[], _T]) -> _T:
        """`answer()`, asked once per key for this trace."""
        if key not in self._answers:
            self._answers[key] = answer()
        value: _T = self._answers[key]  # type: ignore[assignment]
        return value

    # -- the trace as recorded ------------------------------------------------------------

    @property
    def is_text_only(self) -> bool:
        """Only an error text was read: no series, steps or processes."""
        return self.trace.is_text_only

    @cached_property
    def failure(self) -> Failure | None:
        """The memory error the run ended with (else the first recorded), with its stack."""
        return _facts.failure(self.trace)

    @cached_property
    def handled_when_raised(self) -> list[OomInfo]:
        """The memory errors the failing process was still handling when it raised the
        failure's (retries inside an `except` block), oldest first."""
        fail = self.failure
        return [] if fail is None else _facts.handled_when_raised(self.trace, fail)

    @cached_property
    def modules_in_hand(self) -> list[dict[str, Any]]:
        """The module each recorded memory error came out of (`module_in_hand`), in order:
        {} for an error that named none."""
        return [_facts.mapping(e.data.get("module_in_hand")) for e in self.trace.oom_events()]

    @cached_property
    def root_pid(self) -> int | None:
        return _facts.root_pid(self.trace)

    @cached_property
    def kept_graphs(self) -> KeptGraphs | None:
        return _facts.kept_graphs(self.trace)

    @cached_property
    def batch_search(self) -> BatchSearch | None:
        """The batch sizes a finder tried, where one ran (never in an error text alone)."""
        return None if self.is_text_only else batch_search(self.trace)

    @cached_property
    def phases(self) -> list[Phase]:
        """Every loop phase (training, evaluation, prediction), in time order per process."""
        return phases(self.trace)

    @cached_property
    def first_step_t(self) -> float | None:
        """When the first recorded step ended (its boundary); None without steps."""
        return min(self.trace.steps().times(), default=None)

    def stepped_before(self, t: float) -> bool:
        """A step ended at `t` or before: the program had trained (run) at least once."""
        return self.first_step_t is not None and self.first_step_t <= t

    def phase_at(self, t: float, pid: int | None = None) -> Phase | None:
        """The loop phase `pid` (any process when None) was in at `t`, if a loop said."""
        return phase_at(self.trace, t, pid, known=self.phases)  # read once, above

    @cached_property
    def gpu_recorded(self) -> bool:
        return _host.gpu_recorded(self.trace)

    @cached_property
    def cpu_only(self) -> bool:
        """The run used no GPU: the memory that ran out, or every device seen, is host."""
        return _host.cpu_only(self.trace)

    # -- frameworks and devices -----------------------------------------------------------

    def frameworks(self, oom: OomInfo | None = None) -> list[str]:
        """The GPU frameworks involved: those imported, and the one the error names."""
        return _facts.frameworks(self.trace, oom)

    def failed_device(self, oom: OomInfo | None) -> int | None:
        return _facts.failed_device(self.trace, oom)

    def device_total(self, device: int | None, oom: OomInfo | None = None) -> int | None:
        return _facts.device_total(self.trace, device, oom)

    def device_peak_used(self, device: int) -> float | None:
        return _facts.device_peak_used(self.trace, device)

    def sum_at(self, metric: str, device: int | None, t: float) -> float | None:
        return _facts.sum_at(self.trace, metric, device, t)

    def framework_at(self, quantity: str, device: int | None, t: float) -> float | None:
        return _facts.framework_at(self.trace, quantity, device, t)

    def series_named(self, metric: str) -> list[Series]:
        return _facts.series_named(self.trace, metric)

    def framework_devices(self) -> dict[str, set[int]]:
        return _facts.framework_devices(self.trace)

    # -- the memory curve at step boundaries ----------------------------------------------

    def step_curve(self, device: int | None = None) -> Curve | None:
        return self._once(("step_curve", device), lambda: _facts.step_curve(self.trace, device))

    def host_curve(self) -> Curve | None:
        return self._once(("host_curve",), lambda: _facts.host_curve(self.trace))

    def host_curve_metric(self, pid: int | None = None) -> str | None:
        return _facts.host_curve_metric(self.trace, pid)

    def rank_curves(self) -> list[tuple[int, Curve]]:
        return _facts.rank_curves(self.trace)

    def process_curves(self) -> list[tuple[bool, Curve]]:
        return self._once(("process_curves",), lambda: _facts.process_curves(self.trace))

    def process_growth(self) -> ProcessGrowth | None:
        """Whose memory grew step after step, in a job of several processes sampled on their
        own: those that report steps (the training loop) and those beside them (DataLoader
        workers filling their copies of a dataset's cache, a tokenizer's pool). None for a
        single process, or where no process reported steps."""

        def answer() -> ProcessGrowth | None:
            curves = self.process_curves()
            if not any(stepped for stepped, _ in curves):
                return None
            training_grew, beside = False, []
            for stepped, curve in curves:
                fitted = self.steady_growth(curve, None)
                if fitted is not None and stepped:
                    training_grew = True
                elif fitted is not None:
                    beside.append((curve, fitted[0]))
            return ProcessGrowth(training_grew, beside)

        return self._once(("process_growth",), answer)

    def rank_peaks(self) -> dict[int, float]:
        """{rank: the most memory of its own it held}, for a trace of several ranks."""
        return _facts.rank_peaks(self.trace)

    def measured_baselines(self, curve: Curve) -> list[tuple[int, float]]:
        return _facts.measured_baselines(self.trace, curve)

    def baseline_trend(
        self,
        curve: Curve,
        *,
        warmup: int | None = None,
        min_steps: int = _facts.MIN_TREND_STEPS,
    ) -> tuple[Trend, float] | None:
        return _facts.baseline_trend(self.trace, curve, warmup=warmup, min_steps=min_steps)

    def filling_trend(
        self, curve: Curve, *, held_share: float, min_steps: int = _facts.MIN_TREND_STEPS
    ) -> tuple[Trend, float, int] | None:
        return _facts.filling_trend(self.trace, curve, held_share=held_share, min_steps=min_steps)

    def steady_growth(self, curve: Curve, fail: Failure | None) -> tuple[Trend, float, int] | None:
        return _facts.steady_growth(self.trace, curve, fail)

    # -- host memory and its limits -------------------------------------------------------

    def on_host(self, oom: OomInfo) -> bool:
        """The memory that ran out is the host's RAM, not a GPU's."""
        return _host.on_host(self.trace, oom)

    def host_limits(
        self, pid: int | None, at_error: Mapping[str, int] | None = None
    ) -> list[Limit]:
        return _host.host_limits(self.trace, pid, at_error)

    def host_allocator_limit(
        self, oom: OomInfo, stats: Mapping[str, object] | None = None
    ) -> float | None:
        return _host.host_allocator_limit(self.trace, oom, stats)

    def capacity_at_failure(self, fail: Failure) -> float | None:
        return _host.capacity_at_failure(self.trace, fail)

    def shortfall_at_failure(self, fail: Failure) -> float | None:
        return _host.shortfall_at_failure(self.trace, fail)

    def machine_memory(self) -> float | None:
        return _host.machine_memory(self.trace)

    def job_limit(self) -> Limit | None:
        return self._once(("job_limit",), lambda: _host.job_limit(self.trace))

    def curve_capacity(self, curve: Curve, oom: OomInfo | None) -> float | None:
        return _host.curve_capacity(self.trace, curve, oom)

    def job_peak_resident(self) -> Held | None:
        return _host.job_peak_resident(self.trace)

    def address_space_room(self, fail: Failure) -> tuple[Limit, float, float] | None:
        return _host.address_space_room(self.trace, fail)

    def address_space_at_failure(self, fail: Failure) -> float | None:
        return _host.address_space_at_failure(self.trace, fail)

    def resident_at_failure(self, fail: Failure) -> float | None:
        return _host.resident_at_failure(self.trace, fail)

    @cached_property
    def data_held(self) -> Held | None:
        """What the program's data took when it failed (see `memdoc.rules.host.data_held`)."""
        return _host.data_held(self.trace, self.failure) if self.failure is not None else None

    def model_weights(self, fail: Failure) -> ModelWeights | None:
        """The model in hand's weights and the gradients they take, against what the
        program held when it failed (PyTorch, read from the error's traceback)."""
        return self._once(("model_weights", id(fail)), lambda: _model_weights(self, fail))

    def counted_against_limit(self, fail: Failure) -> Counted | None:
        return _host.counted_against_limit(self.trace, fail)


@dataclass(frozen=True)
class ModelWeights:
    """The model the failing code held: its parameters, those of them that take gradients
    (a gradient of each, once backward runs), and what the program held at the error."""

    name: str
    param_bytes: float
    trainable_bytes: float
    held: Held

    @property
    def with_gradients(self) -> float:
        return self.param_bytes + self.trainable_bytes

    @property
    def share(self) -> float:
        """Weights and gradients over what was held (above 1 while the gradients were still
        being made)."""
        return self.with_gradients / self.held.held_bytes


def _model_weights(facts: Facts, fail: Failure) -> ModelWeights | None:
    params, trainable = fail.model.get("param_bytes"), fail.model.get("trainable_bytes")
    if not isinstance(params, int) or not isinstance(trainable, int) or params <= 0:
        return None
    held = facts.data_held if fail is facts.failure else _host.data_held(facts.trace, fail)
    if held is None:
        return None
    name = str(fail.model.get("module") or "the model")
    return ModelWeights(name, float(params), float(max(trainable, 0)), held)
