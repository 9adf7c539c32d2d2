"""The families a scrape builds: the top finding, OOMs, steps, and when the catalogue runs."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from memdoc.metrics.families import MemdocCollector
from memdoc.metrics.identity import JobIdentity
from memdoc.metrics.snapshot import step_rate_per_s
from memdoc.metrics.sources import TraceFileSource
from memdoc.rules.base import Finding
from memdoc.rules.engine import diagnose
from memdoc.rules.spec import confidence_word
from memdoc.trace import Trace, load_trace
from memdoc.trace.model import SCHEMA_VERSION, Event, EventKind, ExitInfo, Header
from memdoc.trace.writer import TraceWriter
from tests.conftest import FIXTURES
from tests.metrics.scrape import Sample

IDENTITY = JobIdentity(host="h", job="j")


def _samples(source: TraceFileSource) -> list[Sample]:
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MemdocCollector(source, IDENTITY))
    text = generate_latest(registry).decode()
    return [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


@pytest.mark.parametrize(
    "fixture",
    [
        pytest.param("fragmentation/hit-recorded-cache.memdoc", id="fragmentation"),
        pytest.param("host-oom/hit-sigkill-near-limit.memdoc", id="host-oom"),
    ],
)
def test_the_top_finding_and_oom_count_are_the_diagnosis_of_the_trace(
    fixture: str, tmp_path: Path
) -> None:
    path = tmp_path / "run.memdoc"
    shutil.copy(FIXTURES / "rules" / fixture, path)
    trace = load_trace(path)
    best = diagnose(trace)[0]

    samples = _samples(TraceFileSource(path))

    top = [s for s in samples if s.name == "memdoc_top_finding_info"]
    assert len(top) == 1
    assert top[0].labels["rule"] == best.rule and top[0].labels["code"] == best.code
    assert top[0].labels["confidence"] == confidence_word(best.confidence)
    sure = [s for s in samples if s.name == "memdoc_top_finding_confidence"]
    assert [(s.labels["rule"], s.value) for s in sure] == [(best.rule, best.confidence)]
    ooms = next(s for s in samples if s.name == "memdoc_ooms_total")
    assert ooms.value == len(trace.oom_events())


def test_before_the_trace_exists_only_the_identity_is_shown(tmp_path: Path) -> None:
    samples = _samples(TraceFileSource(tmp_path / "not-yet.memdoc"))

    assert {s.name for s in samples} == {"memdoc_info", "memdoc_running"}
    assert next(s for s in samples if s.name == "memdoc_running").value == 0.0


def test_the_catalogue_runs_at_most_once_an_interval_and_once_more_at_the_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.memdoc"
    header = Header(version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="t")
    writer = TraceWriter(path, header)
    writer.event(Event(t=time.time(), kind=EventKind.STEP, data={"step": 1}))
    writer.flush_if_due()
    calls: list[int] = []

    def counting(trace: Trace) -> Sequence[Finding]:
        calls.append(len(trace.steps()))
        return diagnose(trace)

    source = TraceFileSource(path, diagnose_fn=counting, rules_interval_s=3600)
    for _ in range(3):
        assert source.snapshot() is not None
    assert len(calls) == 1
    writer.close(ExitInfo(t=time.time(), exit_code=0))
    source.snapshot()
    source.snapshot()
    assert calls[1:] == [1]  # the finished run, once, with everything it recorded


def _trace_with_steps(times: list[float]) -> Trace:
    trace = Trace(Header(version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="t"))
    for i, t in enumerate(times):
        trace.add_event(Event(t=t, kind=EventKind.STEP, data={"step": i + 1}))
    return trace


@pytest.mark.parametrize(
    ("times", "now", "rate"),
    [
        pytest.param([], 10.0, None, id="no-steps"),
        pytest.param([1.0], 10.0, None, id="one-step"),
        pytest.param([1.0, 1.5, 2.0, 2.5], 3.0, 2.0, id="two-a-second"),
        pytest.param([1.0, 2.0], 100.0, 0.0, id="stopped-a-while-ago"),
        pytest.param([0.0, 1.0, 70.0, 71.0, 72.0], 72.0, 1.0, id="only-the-last-minute"),
    ],
)
def test_step_rate_is_over_the_last_minute(
    times: list[float], now: float, rate: float | None
) -> None:
    assert step_rate_per_s(_trace_with_steps(times), now) == rate


def test_the_exporter_forgets_old_values_but_keeps_each_series_last_one() -> None:
    from memdoc.metrics.sources import forget_before
    from memdoc.trace.model import Metric, SeriesKey

    trace = Trace(Header(version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="t"))
    rss, gone = SeriesKey(Metric.HOST_RSS), SeriesKey(Metric.HOST_RSS, pid=7)
    for t in range(1000):
        trace.add_values(float(t), [(rss, float(t))])
    trace.add_values(5.0, [(gone, 42.0)])

    forget_before(trace, 400.0)

    kept = trace.series(Metric.HOST_RSS)
    assert kept is not None and list(kept.times) == [float(t) for t in range(400, 1000)]
    old = trace.series(Metric.HOST_RSS, pid=7)
    assert old is not None and list(old.values) == [42.0]


def _leaking_run(path: Path, *, ended: bool) -> None:
    """A run whose address space grows 5 MiB a step towards a 1000 MiB cap, a step a
    second, recorded through the live forecast as `memdoc run` records it."""
    import itertools

    from memdoc.forecast.live import ForecastingSink
    from memdoc.trace.model import Metric, SeriesKey

    mib, pid, start = 1 << 20, 4242, time.time() - 100.0
    header = Header(version=SCHEMA_VERSION, created_unix=start, memdoc_version="t")
    writer = TraceWriter(path, header)
    ticks = itertools.count(0, 2.0)
    sink = ForecastingSink(writer, start_unix=start, clock=lambda: float(next(ticks)))
    vms, cap = SeriesKey(Metric.HOST_VMS, pid=pid), SeriesKey(Metric.HOST_RLIMIT_AS, pid=pid)
    for step in range(1, 61):
        sink.samples(start + step - 0.5, {vms: 300 * mib + 5 * mib * step, cap: 1000 * mib})
        sink.event(Event(t=start + step, kind=EventKind.STEP, pid=pid, data={"step": step}))
    writer.close(ExitInfo(t=start + 61, exit_code=0) if ended else None)


def test_the_forecast_says_steps_and_seconds_left_and_which_limit(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    _leaking_run(path, ended=False)

    samples = _samples(TraceFileSource(path, diagnose_fn=lambda trace: ()))

    steps = [s for s in samples if s.name == "memdoc_forecast_steps_left"]
    seconds = [s for s in samples if s.name == "memdoc_forecast_seconds_left"]
    limit = [s for s in samples if s.name == "memdoc_forecast_limit_bytes"]
    assert len(steps) == len(seconds) == len(limit) == 1
    # 300 MiB + 5 MiB a step reaches 1000 MiB at step 140: about 80 steps after step 60.
    assert 75 <= steps[0].value <= 85
    assert 75 <= seconds[0].value <= 85  # a step a second
    assert limit[0].value == 1000 * (1 << 20)
    assert steps[0].labels["limit"] == "address-space cap (RLIMIT_AS)"
    assert steps[0].labels["job"] == "j" and steps[0].labels["device"] == ""


def test_no_forecast_is_shown_once_the_run_ended(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    _leaking_run(path, ended=True)

    samples = _samples(TraceFileSource(path, diagnose_fn=lambda trace: ()))

    assert not [s for s in samples if s.name.startswith("memdoc_forecast_")]
