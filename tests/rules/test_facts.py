"""Facts the rules share: frames of the failing stack, where memory ran out, which limit held."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.rules import facts, host
from memdoc.rules.engine import diagnose
from memdoc.rules.facts import Failure, failure, measured_baselines, step_curve
from memdoc.rules.host import (
    Held,
    curve_capacity,
    host_limits,
    job_limit,
    job_peak_resident,
    on_host,
)
from memdoc.rules.text_trace import text_trace
from memdoc.trace import EventKind, Metric, OomInfo, SeriesKey, Trace, load_trace
from tests.rules.fixture_cases import RULE_FIXTURES
from tests.rules.host_scenarios import ADAM_STATE
from tests.rules.recorder import PID, GiB, MiB, Recorder

CPU_OOM = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
    "allocate memory: you tried to allocate 4194304 bytes. Error code 12 (Cannot allocate memory)"
)

ADAM_FAILURE = Failure(oom=OomInfo(framework="pytorch"), t=5.0, pid=PID, stack=ADAM_STATE)


def _recorded(path: Path, oom: OomInfo, *, gpu: bool) -> bool:
    rec = Recorder(path)
    if gpu:
        rec.device(0, 24 * GiB, "NVIDIA RTX A5000")
    rec.sample(0.5, {SeriesKey(Metric.HOST_RSS): 1 * GiB})
    rec.oom(1.0, oom)
    rec.end(1.5, exit_code=1)
    return on_host(load_trace(path), oom)


JAX_ALLOCATOR = OomInfo(framework="jax", kind="allocator", requested_bytes=966_328_320)


@pytest.mark.parametrize(
    ("oom", "gpu", "expected"),
    [
        pytest.param(JAX_ALLOCATOR, False, True, id="allocator-error-in-a-run-without-gpu"),
        pytest.param(JAX_ALLOCATOR, True, False, id="allocator-error-in-a-gpu-run"),
        pytest.param(
            OomInfo(framework="pytorch", kind="host-alloc"), True, True, id="cpu-allocator-anywhere"
        ),
        pytest.param(
            OomInfo(framework="tensorflow", device=0, device_type="cpu"),
            True,
            True,
            id="tf-bfc-on-the-cpu",
        ),
    ],
)
def test_memory_ran_out_on_the_host_when_the_error_or_the_run_says_so(
    tmp_path: Path, oom: OomInfo, gpu: bool, expected: bool
) -> None:
    assert _recorded(tmp_path / "run.memdoc", oom, gpu=gpu) is expected


def test_a_bare_error_text_is_taken_to_be_about_a_gpu() -> None:
    text = "Out of memory allocating 966328320 bytes."

    assert not on_host(text_trace(text, JAX_ALLOCATOR), JAX_ALLOCATOR)


def test_host_limits_come_tightest_first_and_name_what_sets_them(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run.memdoc")
    rec.sample(
        1.0,
        {
            SeriesKey(Metric.HOST_TOTAL): 64 * GiB,
            SeriesKey(Metric.CGROUP_LIMIT): 16 * GiB,
            SeriesKey(Metric.HOST_RLIMIT_AS, pid=PID): 2 * GiB,
            SeriesKey(Metric.HOST_RLIMIT_AS, pid=PID + 1): 1 * GiB,
        },
    )
    rec.end(2.0, exit_code=0)

    limits = host_limits(load_trace(tmp_path / "run.memdoc"), PID)

    assert [(limit.label.split(" ")[0], limit.limit_bytes) for limit in limits] == [
        ("address-space", 2 * GiB),
        ("memory", 16 * GiB),
        ("host", 64 * GiB),
    ]


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        pytest.param({SeriesKey(Metric.CGROUP_LIMIT): 16 * GiB}, ("cgroup", 16 * GiB), id="cgroup"),
        pytest.param(
            {SeriesKey(Metric.CGROUP_LIMIT): 128 * GiB}, ("ram", 64 * GiB), id="cgroup-above-ram"
        ),
        pytest.param(
            {
                SeriesKey(Metric.CGROUP_LIMIT): 16 * GiB,
                SeriesKey(Metric.HOST_RLIMIT_AS, pid=PID): 2 * GiB,
            },
            ("rlimit-as", 2 * GiB),
            id="cap-of-the-program",
        ),
        pytest.param(
            {SeriesKey(Metric.HOST_RLIMIT_AS, pid=PID + 1): 1 * GiB},
            ("ram", 64 * GiB),
            id="cap-of-one-worker-is-not-the-jobs",
        ),
    ],
)
def test_the_job_limit_is_the_tightest_of_the_programs_cap_its_cgroup_and_ram(
    tmp_path: Path, limits: dict[SeriesKey, float], expected: tuple[str, float]
) -> None:
    rec = Recorder(tmp_path / "run.memdoc")
    for t in (1.0, 2.0):
        rec.sample(t, {SeriesKey(Metric.HOST_RSS): t * GiB, SeriesKey(Metric.HOST_TOTAL): 64 * GiB})
        rec.sample(t, limits)
    rec.end(3.0, exit_code=0)
    trace = load_trace(tmp_path / "run.memdoc")

    limit = job_limit(trace)
    curve = step_curve(trace)

    assert limit is not None and (limit.kind, limit.limit_bytes) == expected
    assert curve is not None and curve_capacity(trace, curve, None) == expected[1]


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        pytest.param(0, ("peak memory of the job's own cgroup", 5 * GiB), id="own-cgroup"),
        pytest.param(3, ("peak resident memory of the job", 2 * GiB), id="shared-cgroup"),
        pytest.param(None, ("peak resident memory of the job", 2 * GiB), id="unknown"),
    ],
)
def test_the_jobs_peak_is_its_cgroups_usage_only_when_no_one_else_shares_it(
    tmp_path: Path, others: int | None, expected: tuple[str, float]
) -> None:
    rec = Recorder(tmp_path / "run.memdoc")
    values = {SeriesKey(Metric.HOST_RSS): 2 * GiB, SeriesKey(Metric.CGROUP_USAGE): 5 * GiB}
    if others is not None:
        values[SeriesKey(Metric.CGROUP_OTHER_PROCESSES)] = others
    rec.sample(1.0, values)
    rec.end(2.0, exit_code=0)

    held = job_peak_resident(load_trace(tmp_path / "run.memdoc"))

    assert held is not None and (held.label, held.held_bytes) == expected


def test_steps_shorter_than_a_sample_share_one_baseline(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run.memdoc")
    step = 0
    for i, rss in enumerate([100, 110, 120], start=1):
        rec.sample(float(i), {SeriesKey(Metric.HOST_RSS): rss * MiB})
        for part in (0.2, 0.5, 0.8):  # three steps between two samples
            step += 1
            rec.step(i + part, step)
    rec.end(4.0, exit_code=0)
    trace = load_trace(tmp_path / "run.memdoc")
    curve = step_curve(trace)
    assert curve is not None

    assert len(curve.steps) == 9
    assert measured_baselines(trace, curve) == [(0, 100 * MiB), (3, 110 * MiB), (6, 120 * MiB)]


def test_the_failure_carries_the_live_arrays_a_collector_listed() -> None:
    trace = load_trace(
        RULE_FIXTURES / "xla-temp-buffers" / "hit-request-far-above-live-arrays.memdoc"
    )

    found = failure(trace)

    assert found is not None and found.live_array_bytes == 186_516


def test_a_diagnosis_reads_the_failure_and_the_data_held_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = load_trace(
        RULE_FIXTURES / "xla-temp-buffers" / "hit-request-far-above-live-arrays.memdoc"
    )
    reads: list[str] = []
    failure_of, data_held_of = facts.failure, host.data_held

    def counted_failure(t: Trace) -> Failure | None:
        reads.append("failure")
        return failure_of(t)

    def counted_data_held(t: Trace, fail: Failure) -> Held | None:
        reads.append("data held")
        return data_held_of(t, fail)

    monkeypatch.setattr(facts, "failure", counted_failure)
    monkeypatch.setattr(host, "data_held", counted_data_held)

    findings = diagnose(trace)

    # Both rules that weigh the request against the data held (xla-temp-buffers, and
    # single-allocation-too-large twice) found what they look for, from one reading.
    assert [f.rule for f in findings][:1] == ["xla-temp-buffers"]
    assert reads.count("failure") == 1
    assert reads.count("data held") == 1
    # Nothing is kept between diagnoses: a second one reads afresh (the trace may have grown).
    diagnose(trace)
    assert reads.count("failure") == 2


def test_the_words_of_a_failure_are_read_once_by_the_recogniser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = load_trace(
        RULE_FIXTURES / "xla-temp-buffers" / "hit-request-far-above-live-arrays.memdoc"
    )
    reads: list[str] = []
    text_cues_of = facts.text_cues

    def counted(texts: object) -> object:
        reads.append("text")
        return text_cues_of(texts)  # type: ignore[arg-type]

    monkeypatch.setattr(facts, "text_cues", counted)

    diagnose(trace)

    # Several rules ask what the words said (a phase, a library, a limit): one reading.
    assert reads == ["text"]


OTHER_ERROR = "RuntimeError: something else went wrong entirely here"


@pytest.mark.parametrize(
    ("after_s", "message", "has_stack"),
    [
        pytest.param(0.3, OTHER_ERROR, True, id="within-a-second-whatever-it-says"),
        pytest.param(1.8, CPU_OOM, True, id="read-from-stderr-later-on-a-busy-machine"),
        pytest.param(1.8, OTHER_ERROR, False, id="later-and-another-error"),
    ],
)
def test_the_failure_takes_the_stack_of_the_exception_its_message_repeats(
    tmp_path: Path, after_s: float, message: str, has_stack: bool
) -> None:
    # An OOM read from stderr is recorded when the process has exited, which on a loaded
    # machine can be more than a second after the exception the hook recorded.
    stack = ["train.py:78:main", "torch/nn/modules/linear.py:109:__init__"]
    rec = Recorder(tmp_path / "run.memdoc")
    rec.event(3.0, EventKind.EXCEPTION, message=CPU_OOM[len("RuntimeError: ") :], stack=stack)
    rec.oom(3.0 + after_s, OomInfo(framework="pytorch", kind="host-alloc", message=message))
    rec.end(5.0, exit_code=1)

    found = failure(load_trace(tmp_path / "run.memdoc"))

    assert found is not None
    assert found.stack == (tuple(stack) if has_stack else ())
