"""Following a trace file: only complete new lines are read, damage is skipped, never raised."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from memdoc.errors import TraceError
from memdoc.trace import Metric, load_trace
from memdoc.trace.tail import TraceTail, trace_until


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_reading_in_small_chunks_gives_the_same_trace_as_loading_it(demo_trace: Path) -> None:
    whole = load_trace(demo_trace)
    tail = TraceTail(demo_trace, chunk_bytes=997)  # cuts lines everywhere
    while not tail.caught_up:
        tail.poll()
    followed = tail.trace
    assert followed is not None
    assert followed.values_read == whole.values_read
    assert len(followed.events()) == len(whole.events())
    assert followed.devices() == whole.devices()
    assert followed.exit == whole.exit
    assert tail.damaged_lines == 0


def test_a_cut_last_line_waits_for_the_rest_of_it(tmp_path: Path, demo_trace: Path) -> None:
    lines = _lines(demo_trace)
    path = tmp_path / "growing.memdoc"
    sample = next(i for i, line in enumerate(lines) if line.startswith(b"["))
    path.write_bytes(b"".join(lines[:sample]) + lines[sample][:7])
    tail = TraceTail(path)
    tail.poll()
    assert tail.trace is not None and tail.trace.values_read == 0
    with path.open("ab") as stream:
        stream.write(lines[sample][7:])
    assert tail.poll() == 1
    assert tail.trace.values_read == len(json.loads(lines[sample])) // 2
    assert tail.damaged_lines == 0


def test_damaged_lines_are_counted_and_the_rest_is_read(tmp_path: Path, demo_trace: Path) -> None:
    lines = _lines(demo_trace)
    path = tmp_path / "damaged.memdoc"
    garbage = [
        b"{not json\n",
        b"\x00\xff\xfe random bytes\n",
        b"[1.0, 99999, 5]\n",
    ]  # the last names no series
    path.write_bytes(b"".join(lines[:40] + garbage + lines[40:]))
    tail = TraceTail(path)
    tail.poll()
    assert tail.damaged_lines == 3
    assert tail.trace is not None
    assert tail.trace.values_read == load_trace(demo_trace).values_read


def test_a_file_that_is_not_a_trace_raises_and_keeps_raising(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\nworld\n")
    tail = TraceTail(path)
    for _ in range(2):
        with pytest.raises(TraceError, match="not a memdoc trace"):
            tail.poll()


def test_a_file_not_written_yet_reads_as_nothing_new(tmp_path: Path) -> None:
    tail = TraceTail(tmp_path / "later.memdoc")
    assert tail.poll() == 0
    assert tail.trace is None


def test_a_replaced_file_is_read_again_from_its_start(tmp_path: Path, demo_trace: Path) -> None:
    path = tmp_path / "run.memdoc"
    shutil.copy(demo_trace, path)
    tail = TraceTail(path)
    tail.poll()
    path.write_bytes(b"".join(_lines(demo_trace)[:5]))  # a new run with --force
    tail.poll()
    assert tail.restarts == 1
    assert tail.trace is not None and tail.trace.values_read < 100


def test_a_compressed_trace_is_read_whole(tmp_path: Path, demo_trace: Path) -> None:
    path = tmp_path / "run.memdoc.gz"
    path.write_bytes(gzip.compress(demo_trace.read_bytes()))
    tail = TraceTail(path)
    tail.poll()
    assert tail.trace is not None and tail.trace.complete
    assert tail.poll() == 0


def test_trace_until_keeps_only_what_happened_up_to_that_instant(demo_trace: Path) -> None:
    trace = load_trace(demo_trace)
    prefix = trace_until(trace, 10.0)
    series = prefix.series("torch.allocated", device=0, pid=4243)
    assert series is not None and max(series.times) <= 10.0
    assert len(series) == len(
        trace.series("torch.allocated", device=0, pid=4243).window(0, 10.0)[0]
    )
    assert all(e.t <= 10.0 for e in prefix.events())
    assert prefix.ending_oom() is None and trace.ending_oom() is not None
    assert prefix.exit is None and not prefix.complete
    assert prefix.series(Metric.GPU_USED, device=1) is not None
    assert trace_until(trace, 1e9).values_read == trace.values_read
