"""The trace file: what is written is read back, damage is salvaged, strangers are refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from memdoc.errors import OutputExistsError, TraceError
from memdoc.trace import (
    DeviceInfo,
    Event,
    EventKind,
    ExitInfo,
    Header,
    Metric,
    OomInfo,
    SeriesKey,
    TraceWriter,
    load_run,
    load_trace,
)
from memdoc.trace.model import SCHEMA_VERSION

GiB = 1024**3


def _header(t0: float) -> Header:
    return Header(version=SCHEMA_VERSION, created_unix=t0, memdoc_version="test", command=("x.py",))


def _write_small(path: Path, t0: float = 1000.0) -> None:
    w = TraceWriter(path, _header(t0))
    w.device(DeviceInfo(index=0, name="NVIDIA H200", total_bytes=141 * GiB))
    for i in range(10):
        w.samples(
            t0 + i * 0.1,
            {
                SeriesKey(Metric.HOST_RSS): 100 + i,
                SeriesKey("torch.allocated", device=0, pid=7): i * GiB,
                SeriesKey("torch.allocated_peak", device=0, pid=7): i * GiB + 5,
            },
        )
        w.event(Event(t=t0 + i * 0.1 + 0.05, kind=EventKind.STEP, pid=7, data={"step": i + 1}))
    w.event(
        Event(
            t=t0 + 1.0,
            kind=EventKind.OOM,
            pid=7,
            data={"oom": OomInfo(framework="pytorch", requested_bytes=GiB).to_dict()},
        )
    )
    w.close(ExitInfo(t=t0 + 1.2, exit_code=1))


def test_written_values_events_and_exit_are_read_back(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    _write_small(path)

    trace = load_trace(path)

    rss = trace.series(Metric.HOST_RSS)
    assert rss is not None and list(rss.values) == [100 + i for i in range(10)]
    assert rss.times[3] == pytest.approx(0.3)
    assert trace.peak("torch.allocated", device=0, pid=7) == (pytest.approx(0.9), 9 * GiB + 5)
    assert [e.data["step"] for e in trace.steps()] == list(range(1, 11))
    assert trace.ending_oom() == OomInfo(framework="pytorch", requested_bytes=GiB)
    assert trace.exit is not None and trace.exit.status == 1
    assert trace.devices()[0].total_bytes == 141 * GiB
    assert trace.warnings == []


def test_per_step_gives_baseline_after_and_peak_inside_each_step(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    _write_small(path)

    stats = load_trace(path).per_step("torch.allocated", device=0, pid=7)

    assert len(stats) == 10
    assert stats[4].baseline == 4 * GiB
    assert stats[4].peak == 4 * GiB + 5


def test_a_cut_last_line_is_salvaged_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    _write_small(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])

    trace = load_trace(path)

    assert trace.exit is None
    assert len(trace.steps()) == 10
    assert trace.warnings and "last line" in trace.warnings[0]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"", "empty file", id="empty"),
        pytest.param(b"\x00\x01garbage\n", "not a memdoc trace", id="garbage"),
        pytest.param(b'{"hello": 1}\n', "not a memdoc trace", id="other-json"),
        pytest.param(
            json.dumps({"type": "header", "format": "memdoc-trace", "version": 99}).encode(),
            "version 99 is newer",
            id="future-version",
        ),
    ],
)
def test_files_that_are_not_readable_traces_get_one_clear_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "t.memdoc"
    path.write_bytes(content)

    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_an_existing_output_is_not_overwritten_without_force(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    path.write_text("precious")

    with pytest.raises(OutputExistsError):
        TraceWriter(path, _header(0.0))
    assert path.read_text() == "precious"

    TraceWriter(path, _header(0.0), force=True).close()
    assert load_trace(path).header.command == ("x.py",)


def test_the_trace_is_readable_while_being_written(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    w = TraceWriter(path, _header(time.time()))
    w.samples(time.time(), {SeriesKey(Metric.HOST_RSS): 1})
    w.event(Event(t=time.time(), kind=EventKind.OOM, data={}))  # urgent: flushed at once

    trace = load_trace(path)

    assert not trace.complete
    assert trace.series(Metric.HOST_RSS) is not None
    w.close()


def test_values_that_are_not_numbers_are_recorded_as_missing(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    w = TraceWriter(path, _header(0.0))
    w.samples(0.1, {SeriesKey("a"): float("nan"), SeriesKey("b"): 3})
    w.close()

    trace = load_trace(path)

    assert trace.series("a") is None
    assert trace.series("b") is not None


def test_several_traces_read_as_one_run_name_the_rank_that_failed_first(tmp_path: Path) -> None:
    ok, failed = tmp_path / "r0.memdoc", tmp_path / "r1.memdoc"
    w = TraceWriter(ok, _header(1000.0))
    w.close(ExitInfo(t=1005.0, exit_code=0))
    _write_small(failed, t0=1001.0)

    run = load_run([ok, failed])

    assert run.failed_first() is run.traces[1]
    assert run.primary is run.traces[1]


def test_a_gzipped_trace_reads_like_a_plain_one(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "run.memdoc"
    _write_small(path)
    gz = tmp_path / "run.memdoc.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))

    assert len(load_trace(gz).steps()) == 10


def test_non_finite_values_in_a_damaged_file_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "run.memdoc"
    _write_small(path)
    lines = path.read_text().splitlines()
    lines.insert(3, "[0.55,0,NaN,1,Infinity]")
    path.write_text("\n".join(lines) + "\n")

    rss = load_trace(path).series(Metric.HOST_RSS)

    assert rss is not None and all(v == v for v in rss.values)
    assert 0.55 not in list(rss.times)


def test_a_copy_of_a_trace_reads_the_same_and_does_not_see_later_additions(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.memdoc"
    _write_small(path)
    trace = load_trace(path)
    key = trace.series_keys()[0]
    before = list(trace.series(key.metric, key.device, key.pid).values)

    twin = trace.copy()
    trace.add_values(99.0, [(key, 123.0)])
    trace.add_event(Event(t=99.0, kind=EventKind.MARK, data={"name": "later"}))

    copied = twin.series(key.metric, key.device, key.pid)
    assert list(copied.values) == before
    assert len(twin.events()) == len(trace.events()) - 1
    assert twin.devices() == trace.devices() and twin.header is trace.header
    assert twin.last_t < trace.last_t
