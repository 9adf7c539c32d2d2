"""Forecasts while the program runs: a sink that watches samples and steps on their way to
the trace and writes a `forecast` event when an OOM becomes likely or its forecast moves."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Mapping

from memdoc.collectors.base import Sink
from memdoc.forecast.budget import (
    Budget,
    LoopPlan,
    assemble,
    budget_for,
    is_limit,
    loop_plan,
    peak_source,
    superseded_by,
)
from memdoc.forecast.model import Forecast, NoForecast
from memdoc.forecast.predict import analyse, earliest, first_epoch_judged_at
from memdoc.trace.model import (
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    ProcessInfo,
    SeriesKey,
)
from memdoc.trace.phases import changes_batch_size

# Bounded memory and work: recent samples per measured series, recent steps per series.
MAX_SAMPLES = 4096
MAX_STEPS = 512
# A forecast is recomputed at a step boundary, and at most this often.
RECOMPUTE_EVERY_S = 2.0
# A forecast further away than this is not "likely" during this run.
HORIZON_S = 24 * 3600.0
# A new event when the steps left move by more than this share, or the limit changes.
MATERIAL_CHANGE = 0.2


class ForecastingSink:
    """Passes everything to `inner` unchanged; keeps recent values of the measured series
    and, at step boundaries, forecasts when their per-step peak will cross its limit.

    Samples and events may come from several threads (the sampler, the agents' channel).
    """

    def __init__(
        self, inner: Sink, *, start_unix: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = inner
        self.start_unix = start_unix
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[SeriesKey, collections.deque[tuple[float, float]]] = {}
        self._budgets: dict[SeriesKey, Budget] = {}
        self._peak_of: dict[SeriesKey, SeriesKey] = {}
        self._ignored: set[SeriesKey] = set()
        self._limits: dict[SeriesKey, float] = {}
        self._totals: dict[int, int] = {}
        self._points: dict[SeriesKey, collections.deque[tuple[int, float, float]]] = {}
        self._last_step_t: dict[SeriesKey, float] = {}
        self._step_pid: int | None = None
        self._last_step = 0
        self._plan = LoopPlan()  # the loop's last step and epochs, where it said
        self._next_compute = float("-inf")
        self._judged_at_step: int | None = None  # a step that may change the forecast
        self._computed_at_step = -1  # the step of the last recomputation
        self.latest: Forecast | None = None  # the last forecast written
        self.failed = False  # set when forecasting broke; the sink then only passes on

    # -- Sink -----------------------------------------------------------------------------

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        self.inner.samples(unix_t, values)
        if self.failed:
            return
        try:
            with self._lock:
                for key, value in values.items():
                    self._take(key, unix_t, value)
        except Exception:
            self.failed = True  # a forecast is a nicety: never at the cost of the recording

    def event(self, event: Event) -> None:
        self.inner.event(event)
        if event.kind not in (EventKind.STEP, EventKind.MARK) or self.failed:
            return
        try:
            if event.kind == EventKind.MARK:
                with self._lock:
                    self._plan = loop_plan(event, self._last_step) or self._plan
                    if changes_batch_size(event):  # another size: the trend starts again
                        self._points.clear()
                    if event.is_phase_mark:
                        # What a phase between two steps held (an evaluation's spike) is
                        # not the next training step's peak: its window starts here.
                        for key in self._last_step_t:
                            self._last_step_t[key] = max(self._last_step_t[key], event.t)
            else:
                self._on_step(event)
        except Exception:
            # Steps come from the program's own thread under `memdoc.watch`: nothing may
            # reach it from here.
            self.failed = True

    def _on_step(self, event: Event) -> None:
        number = event.data.get("step")
        if not isinstance(number, int):
            return
        with self._lock:
            if self._step_pid is None:
                self._step_pid = event.pid
            if event.pid != self._step_pid:
                return  # one process's steps count, as the reader does
            self._last_step = number
            self._close_step(number, event.t)
            now = self._clock()
            if now < self._next_compute and not self._due(number):
                return
            self._next_compute = now + RECOMPUTE_EVERY_S
            self._computed_at_step = number
            self._recompute(event.t)

    def _due(self, number: int) -> bool:
        """True when a step since the last recomputation may change the forecast: the step
        a held-back forecast waits for, or the one where the loop's plan says its first
        epoch's growth is judged (known from the plan, whether or not a recomputation came
        during the first epoch: one every RECOMPUTE_EVERY_S can miss a fast epoch)."""
        epochs = self._plan.epochs
        waits = (self._judged_at_step, first_epoch_judged_at(*epochs) if epochs else None)
        return any(w is not None and self._computed_at_step < w <= number for w in waits)

    def settle(self, unix_t: float) -> None:
        """Forecast once more from every step seen, when the run has ended: the last
        forecast of the trace then speaks for the whole run, not for the run as it was at
        the last recomputation (at most RECOMPUTE_EVERY_S before its end)."""
        if self.failed:
            return
        try:
            with self._lock:
                self._recompute(unix_t)
        except Exception:
            self.failed = True

    def _recompute(self, unix_t: float) -> None:
        """Forecast from the steps seen; write it when it is new or moved (lock held)."""
        result = self._forecast()
        if result is not None or self.latest is not None:
            self._maybe_write(result, unix_t)

    def device(self, device: DeviceInfo) -> None:
        self.inner.device(device)
        if device.total_bytes:
            with self._lock:
                self._totals[device.index] = device.total_bytes

    def process(self, process: ProcessInfo) -> None:
        self.inner.process(process)

    def collector(self, status: CollectorStatus) -> None:
        self.inner.collector(status)

    # -- bookkeeping (lock held) ----------------------------------------------------------

    def _take(self, key: SeriesKey, unix_t: float, value: float) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        if not math.isfinite(value):
            return
        if key in self._budgets or key in self._peak_of:
            self._samples[key].append((unix_t, float(value)))
            return
        if key in self._ignored:
            return
        if is_limit(key):
            if value > 0:
                self._limits[key] = float(value)
            return
        budget = budget_for(key)
        base = peak_source(key)
        if budget is not None and self._supersedes(key):
            self._ignored.add(key)  # its budget is another series', recorded already
            return
        if budget is not None:
            self._budgets[key] = budget
        elif base is not None:
            self._peak_of[key] = base
        else:
            self._ignored.add(key)  # neither measured nor a limit: never looked at again
            return
        self._samples[key] = collections.deque([(unix_t, float(value))], maxlen=MAX_SAMPLES)

    def _supersedes(self, key: SeriesKey) -> bool:
        """True when `key`'s budget goes to a series already followed; a series that takes
        over another's budget (see `superseded_by`) ends the forecast of the other."""
        if superseded_by(key) in self._budgets:
            return True
        for old in [k for k in self._budgets if superseded_by(k) == key]:
            del self._budgets[old]
            self._samples.pop(old, None)
            self._points.pop(old, None)
            self._ignored.add(old)
        return False

    def _close_step(self, number: int, unix_t: float) -> None:
        for key in self._budgets:
            sources = [key, *(p for p, base in self._peak_of.items() if base == key)]
            t_prev = self._last_step_t.get(key, float("-inf"))
            best: float | None = None
            for source in sources:
                samples = self._samples.get(source)
                if not samples:
                    continue
                inside = [v for t, v in samples if t_prev < t <= unix_t]
                if inside:
                    best = max(inside) if best is None else max(best, *inside)
                while samples and samples[0][0] <= unix_t:
                    samples.popleft()
            self._last_step_t[key] = unix_t
            if best is not None:
                points = self._points.setdefault(key, collections.deque(maxlen=MAX_STEPS))
                points.append((number, unix_t, best))

    def _forecast(self) -> Forecast | None:
        results = []
        for key, points in self._points.items():
            budget = self._budgets[key]
            limit = self._limits.get(budget.limit) if budget.limit is not None else None
            label = budget.label
            if not limit and budget.total_device is not None:
                limit, label = self._totals.get(budget.total_device), budget.total_label
            steps = [p[0] for p in points]
            times = [p[1] - self.start_unix for p in points]
            peaks = [p[2] for p in points]
            series = assemble(budget, steps, times, peaks, limit, label=label, plan=self._plan)
            if series is not None:
                results.append(analyse(series))
        # A forecast held back until a step (the first epoch's growth, judged in the second)
        # is made at that step, not up to RECOMPUTE_EVERY_S later.
        self._judged_at_step = min(
            (r.judged_at_step for r in results if isinstance(r, NoForecast) and r.judged_at_step),
            default=None,
        )
        best = earliest(results)
        return best if isinstance(best, Forecast) else None

    # -- writing --------------------------------------------------------------------------

    def _maybe_write(self, result: Forecast | None, unix_t: float) -> None:
        likely = result is not None and (result.eta_s is None or result.eta_s <= HORIZON_S)
        previous = self.latest
        if not likely:
            if previous is not None:
                self.latest = None
                self.inner.event(
                    Event(t=unix_t, kind=EventKind.FORECAST, data={"state": "cleared"})
                )
            return
        assert result is not None
        if previous is not None and not _moved(previous, result):
            return
        self.latest = result
        data = {"state": "likely", **result.to_data()}
        self.inner.event(Event(t=unix_t, kind=EventKind.FORECAST, data=data))


def _moved(before: Forecast, now: Forecast) -> bool:
    if (before.metric, before.limit_bytes, before.pid, before.device) != (
        now.metric,
        now.limit_bytes,
        now.pid,
        now.device,
    ):
        return True
    left_before = max(before.oom_step - now.step, 1)
    left_now = max(now.steps_left, 1)
    return abs(left_now - left_before) > MATERIAL_CHANGE * left_before
