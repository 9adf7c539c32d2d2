"""The live forecast: samples and steps pass through to the trace unchanged, and a
`forecast` event is written when an OOM becomes likely, moves, or no longer holds."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from memdoc.forecast import Forecast, NoForecast, assess
from memdoc.forecast.budget import trace_step_series
from memdoc.forecast.live import ForecastingSink
from memdoc.forecast.model import ENDS_FIRST
from memdoc.forecast.summary import forecast_in_force
from memdoc.trace import load_trace
from memdoc.trace.model import SCHEMA_VERSION, Event, EventKind, Header, Metric, SeriesKey
from memdoc.trace.writer import TraceWriter

MiB = 1 << 20
PID = 4242
START = 1_700_000_000.0
VMS = SeriesKey(Metric.HOST_VMS, pid=PID)
CAP = SeriesKey(Metric.HOST_RLIMIT_AS, pid=PID)


def recorded(
    tmp_path: Path,
    peaks: list[float],
    *,
    cap: float = 1000 * MiB,
    recomputed: int | None = None,
    settle: bool = False,
    planned_steps: int | None = None,
    epoch_steps: int | None = None,
    plan_after_phase: bool = False,
) -> Path:
    """Write a trace the way `memdoc run` does: samples between step events. With
    `recomputed`, the clock stands still after that many steps, as in a run whose last steps
    all come within RECOMPUTE_EVERY_S; `settle` ends the run as `memdoc run` does."""
    path = tmp_path / "run.memdoc"
    path.unlink(missing_ok=True)
    header = Header(version=SCHEMA_VERSION, created_unix=START, memdoc_version="test")
    writer = TraceWriter(path, header)
    ticks: Iterator[float] = itertools.count(0, 2.0)
    if recomputed is not None:
        ticks = itertools.chain(itertools.islice(ticks, recomputed), itertools.repeat(1e9))
    sink = ForecastingSink(writer, start_unix=START, clock=lambda: float(next(ticks)))
    if planned_steps is not None:  # the training loop says how many steps it will run
        # ... in its phase mark, or (Lightning, the Trainer) in a mark of its own once it
        # has counted them from its data
        plan: dict[str, object] = {"planned_steps": planned_steps}
        if epoch_steps is not None:
            plan["epoch_steps"] = epoch_steps
        phase = {"label": "train", "phase": "train"}
        marks = [{**phase, **plan}] if not plan_after_phase else [phase, {"label": "plan", **plan}]
        for data in marks:
            sink.event(Event(t=START + 0.1, kind=EventKind.MARK, pid=PID, data=data))
    for step, peak in enumerate(peaks, 1):
        t = START + step
        sink.samples(t - 0.5, {VMS: peak - 2 * MiB, CAP: cap})
        sink.samples(t - 0.3, {VMS: peak})
        sink.event(Event(t=t, kind=EventKind.STEP, pid=PID, data={"step": step}))
    if settle:
        sink.settle(START + len(peaks) + 0.5)
    writer.close()
    return path


def forecast_events(path: Path) -> list[Event]:
    return load_trace(path).events(EventKind.FORECAST)


def test_a_leak_is_forecast_once_while_it_holds_steady(tmp_path: Path) -> None:
    path = recorded(tmp_path, [300 * MiB + 5 * MiB * i for i in range(60)])
    events = forecast_events(path)
    assert len(events) == 1
    said = Forecast.from_data(events[0].data)
    assert said is not None
    # 300 MiB + 5 MiB × (step - 1) reaches the 1000 MiB cap at step 141.
    assert abs(said.oom_step - 141) <= 2
    assert said.limit_label == "address-space cap (RLIMIT_AS)"
    assert said.t_s == events[0].t  # seconds since the trace started, as event times
    assert said.pid == PID


def test_samples_and_steps_reach_the_trace_unchanged(tmp_path: Path) -> None:
    trace = load_trace(recorded(tmp_path, [300 * MiB + 5 * MiB * i for i in range(20)]))
    assert len(trace.steps()) == 20
    vms = trace.series(Metric.HOST_VMS, pid=PID)
    assert vms is not None and len(vms) == 40


def test_a_leak_that_stops_clears_the_forecast(tmp_path: Path) -> None:
    peaks = [300 * MiB + 5 * MiB * i for i in range(30)] + [445 * MiB] * 150
    events = forecast_events(recorded(tmp_path, peaks))
    assert [e.data["state"] for e in events][0] == "likely"
    assert events[-1].data["state"] == "cleared"
    trace = load_trace(tmp_path / "run.memdoc")
    assert forecast_in_force(trace, events[0].t) is not None
    assert forecast_in_force(trace, trace.last_t) is None


def test_the_forecast_at_the_end_of_a_run_speaks_for_all_of_its_steps(tmp_path: Path) -> None:
    # Growth for 30 steps, then flat for 150, with no recomputation after the growth (the
    # flat steps all came within the recompute interval): the end of the run forecasts again.
    peaks = [300 * MiB + 5 * MiB * i for i in range(30)] + [445 * MiB] * 150
    unsettled = forecast_events(recorded(tmp_path, peaks, recomputed=30))
    assert [e.data["state"] for e in unsettled] == ["likely"]  # said while it grew, and kept
    settled = forecast_events(recorded(tmp_path, peaks, recomputed=30, settle=True))
    assert [e.data["state"] for e in settled] == ["likely", "cleared"]
    trace = load_trace(tmp_path / "run.memdoc")
    assert forecast_in_force(trace, trace.last_t) is None
    # Still growing at the end: the forecast made during the growth stands, said once.
    growing = forecast_events(recorded(tmp_path, peaks[:30], recomputed=20, settle=True))
    assert [e.data["state"] for e in growing] == ["likely"]


def test_a_leak_that_the_loops_end_comes_before_writes_no_forecast(tmp_path: Path) -> None:
    # 300 MiB + 5 MiB a step reaches the 1000 MiB cap at about step 140.
    peaks = [300 * MiB + 5 * MiB * i for i in range(60)]

    before_the_cap = recorded(tmp_path, peaks, planned_steps=100)
    assert forecast_events(before_the_cap) == []
    later = assess(load_trace(before_the_cap))  # read again from the trace, after the run
    assert isinstance(later, NoForecast) and later.reason == ENDS_FIRST
    past_the_cap = recorded(tmp_path, peaks, planned_steps=500)
    assert forecast_events(past_the_cap)[0].data["state"] == "likely"


def test_a_faster_leak_moves_the_forecast(tmp_path: Path) -> None:
    peaks = [300 * MiB + 2 * MiB * i for i in range(40)]
    peaks += [peaks[-1] + 12 * MiB * i for i in range(1, 40)]
    events = forecast_events(recorded(tmp_path, peaks, cap=1200 * MiB))
    said = [Forecast.from_data(e.data) for e in events if e.data["state"] == "likely"]
    assert len(said) >= 2
    assert said[-1] is not None and said[0] is not None
    assert said[-1].oom_step < said[0].oom_step


def test_flat_memory_writes_no_forecast(tmp_path: Path) -> None:
    assert forecast_events(recorded(tmp_path, [500 * MiB + (i % 4) * MiB for i in range(80)])) == []


class BrokenClock:
    """A clock that fails: whatever breaks inside the forecast must stay inside it."""

    def __call__(self) -> float:
        raise RuntimeError("clock broke")


def test_a_failing_forecast_never_reaches_the_program_and_the_trace_goes_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.memdoc"
    header = Header(version=SCHEMA_VERSION, created_unix=START, memdoc_version="test")
    writer = TraceWriter(path, header)
    sink = ForecastingSink(writer, start_unix=START, clock=BrokenClock())
    sink.samples(START + 0.5, {VMS: float("nan"), CAP: 1000 * MiB})
    sink.samples(START + 0.6, {VMS: 300 * MiB})
    for step in (1, 2, 3):
        sink.event(Event(t=START + step, kind=EventKind.STEP, pid=PID, data={"step": step}))
    writer.close()
    assert sink.failed
    assert len(load_trace(path).steps()) == 3


def test_the_ram_forecast_follows_the_memory_the_program_owns_not_its_file_pages(
    tmp_path: Path,
) -> None:
    # RSS grows 4 MiB a step from a memory-mapped dataset's pages; the program's own memory
    # stays flat: nothing runs out of RAM, though RSS alone would reach it.
    header = Header(version=SCHEMA_VERSION, created_unix=START, memdoc_version="test")
    rss, own, total = (SeriesKey(m) for m in (Metric.HOST_RSS, Metric.HOST_ANON, Metric.HOST_TOTAL))

    def run(with_own: bool) -> list[Event]:
        path = tmp_path / f"ram-{with_own}.memdoc"
        writer = TraceWriter(path, header)
        ticks = itertools.count(0, 2.0)
        sink = ForecastingSink(writer, start_unix=START, clock=lambda: float(next(ticks)))
        for step in range(1, 80):
            values = {rss: 300 * MiB + 4 * MiB * step, total: 1000 * MiB}
            if with_own:
                values[own] = 200 * MiB + (step % 3) * MiB
            sink.samples(START + step - 0.5, values)
            sink.event(Event(t=START + step, kind=EventKind.STEP, pid=PID, data={"step": step}))
        writer.close()
        return forecast_events(path)

    assert [e.data["metric"] for e in run(with_own=False)][:1] == [Metric.HOST_RSS]
    assert run(with_own=True) == []


@pytest.mark.parametrize("plan_after_phase", [False, True], ids=["phase-mark", "plan-mark"])
def test_a_leak_past_a_fast_first_epoch_is_forecast_at_the_step_its_plan_judges(
    tmp_path: Path, plan_after_phase: bool
) -> None:
    # GIVEN a fit of 3 epochs of 50 steps leaking 8 MiB a step (the cap at about step 100),
    # whose steps come so fast that no recomputation falls in its first epoch after step 2
    peaks = [200 * MiB + 8 * MiB * i for i in range(95)]
    path = recorded(
        tmp_path,
        peaks,
        recomputed=1,
        planned_steps=150,
        epoch_steps=50,
        plan_after_phase=plan_after_phase,
    )
    # THEN the forecast is made at the step the plan judges the first epoch's growth (12
    # steps into the second), not left to the next recomputation
    (said,) = forecast_events(path)
    assert said.data["state"] == "likely"
    assert said.data["step"] == 62
    assert said.data["oom_step"] == 101


def test_a_batch_size_search_is_no_trend_the_forecast_starts_after_it(tmp_path: Path) -> None:
    """A finder tries six sizes of 5 steps each, each holding 60 MiB more than the last, and
    the fit then trains flat at the size it chose: nothing grows within a size."""
    path = tmp_path / "run.memdoc"
    writer = TraceWriter(
        path, Header(version=SCHEMA_VERSION, created_unix=START, memdoc_version="t")
    )
    ticks = itertools.count(0, 2.0)
    sink = ForecastingSink(writer, start_unix=START, clock=lambda: float(next(ticks)))
    sizes = [32, 64, 128, 256, 512, 1024]
    peaks = [300 * MiB + 60 * MiB * k for k in range(len(sizes)) for _ in range(5)]
    peaks += [300 * MiB + 60 * MiB * (len(sizes) - 1)] * 30
    for step, peak in enumerate(peaks, 1):
        t = START + step
        if step % 5 == 1 and step <= 5 * len(sizes):
            size = sizes[step // 5]
            data = {"label": f"batch size {size}", "batch_size": size, "finder": "lightning"}
            sink.event(Event(t=t - 0.9, kind=EventKind.MARK, pid=PID, data=data))
            trial = {"label": "train", "phase": "train", "planned_steps": 5}  # each try's fit
            sink.event(Event(t=t - 0.8, kind=EventKind.MARK, pid=PID, data=trial))
        sink.samples(t - 0.5, {VMS: peak - 2 * MiB, CAP: 1000 * MiB})
        sink.samples(t - 0.3, {VMS: peak})
        sink.event(Event(t=t, kind=EventKind.STEP, pid=PID, data={"step": step}))
    writer.close()

    assert forecast_events(path) == []
    assert not isinstance(assess(load_trace(path), until_s=35.0), Forecast)
    # The last try's plan counts from the step before its mark (25), not from the first
    # step after the last size change.
    (series,) = trace_step_series(load_trace(path))
    assert series.planned_end_step == 30


def test_an_evaluation_between_steps_is_not_the_next_steps_peak(tmp_path: Path) -> None:
    """Training flat at 400 MiB; every 10 steps an evaluation phase reaches 100 MiB more,
    a little more each time (its allocator keeps a few MiB): the steps never grew."""
    path = tmp_path / "run.memdoc"
    writer = TraceWriter(
        path, Header(version=SCHEMA_VERSION, created_unix=START, memdoc_version="t")
    )
    ticks = itertools.count(0, 2.0)
    sink = ForecastingSink(writer, start_unix=START, clock=lambda: float(next(ticks)))
    for step in range(1, 61):
        t = START + step
        if step % 10 == 1 and step > 1:
            spike = 500 * MiB + 4 * MiB * step
            for label, at in (("eval", t - 0.9), ("train", t - 0.6)):
                mark = {"label": label, "phase": label}
                sink.event(Event(t=at, kind=EventKind.MARK, pid=PID, data=mark))
                if label == "eval":
                    sink.samples(at + 0.1, {VMS: spike, CAP: 1000 * MiB})
        sink.samples(t - 0.5, {VMS: 398 * MiB, CAP: 1000 * MiB})
        sink.samples(t - 0.3, {VMS: 400 * MiB})
        sink.event(Event(t=t, kind=EventKind.STEP, pid=PID, data={"step": step}))
    writer.close()

    assert forecast_events(path) == []
    trace = load_trace(path)
    assert not isinstance(assess(trace), Forecast)
    # The reader's per-step peaks leave the evaluations out too: each step's is 400 MiB.
    peaks = {s.peak for s in trace.per_step(Metric.HOST_VMS, pid=PID)[1:]}
    assert peaks == {400 * MiB}
