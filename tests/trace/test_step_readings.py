"""Each step event carries its process's own memory at the boundary (resident and anonymous
bytes, from /proc/self/statm), and the per-step baselines on the host read it: exact
however short the step, where samples come every 100 ms or more."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from memdoc.collectors.own import step_memory, trim_heap
from memdoc.rules.facts import host_curve, measured_baselines
from memdoc.trace import Event, EventKind, Header, Metric, SeriesKey, TraceWriter, load_trace
from memdoc.trace.model import SCHEMA_VERSION, STEP_HOST_READINGS
from memdoc.units import MiB
from tests.conftest import run_memdoc

ANON = STEP_HOST_READINGS[Metric.HOST_ANON]

pytestmark = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="Linux /proc")


def _rss_anon_from_status() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def test_the_reading_is_the_kernels_anonymous_resident_memory() -> None:
    held = bytearray(8 * MiB)  # touched: resident and anonymous
    reading = step_memory()
    assert abs(reading[ANON] - _rss_anon_from_status()) < MiB
    assert reading["host_rss_bytes"] >= reading[ANON] >= 8 * MiB
    del held


def test_a_forked_child_reads_its_own_memory_not_its_parents() -> None:
    step_memory()  # the parent's descriptor is open
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        grown = bytearray(64 * MiB)
        os.write(write, str(step_memory()[ANON]).encode())
        del grown
        os._exit(0)
    os.close(write)
    child = int(os.read(read, 64))
    os.waitpid(pid, 0)
    assert child - step_memory()[ANON] > 48 * MiB


def _trace(path: Path, *, readings: bool) -> None:
    """A process (pid 7) and a worker (pid 8) sampled every second; pid 7 steps every 0.1 s
    and keeps 1 MiB a step, the worker holds 50 MiB."""
    t0 = 1000.0
    w = TraceWriter(path, Header(SCHEMA_VERSION, t0, "test", ("x.py",)))
    own = lambda t: 100 * MiB + int((t - t0) / 0.1) * MiB  # noqa: E731
    for second in range(4):
        t = t0 + second
        w.samples(
            t,
            {
                SeriesKey(Metric.HOST_ANON): own(t) + 50 * MiB,
                SeriesKey(Metric.HOST_ANON, pid=7): own(t),
                SeriesKey(Metric.HOST_ANON, pid=8): 50 * MiB,
            },
        )
    for i in range(1, 31):
        t = t0 + i * 0.1 + 0.001
        data = {"step": i, "source": "user"}
        if readings:
            data[ANON] = own(t)
        w.event(Event(t=t, kind=EventKind.STEP, pid=7, data=data))
    w.close()


def test_step_baselines_are_the_readings_in_the_process_and_in_its_tree(tmp_path: Path) -> None:
    _trace(tmp_path / "t.memdoc", readings=True)
    trace = load_trace(tmp_path / "t.memdoc")

    mine = trace.per_step(Metric.HOST_ANON, None, 7)
    tree = trace.per_step(Metric.HOST_ANON)

    assert [s.baseline for s in mine] == [100 * MiB + i * MiB for i in range(1, 31)]
    assert all(s.exact for s in mine)
    # The tree: the worker as last sampled, the stepping process at the boundary.
    assert [s.baseline for s in tree] == [150 * MiB + i * MiB for i in range(1, 31)]
    curve = host_curve(trace)
    assert curve is not None and len(measured_baselines(trace, curve)) == 30
    assert trace.per_step(Metric.HOST_ANON, None, 8)[5].exact is False  # not the stepper


def test_without_readings_steps_between_two_samples_share_one(tmp_path: Path) -> None:
    _trace(tmp_path / "t.memdoc", readings=False)  # a trace of memdoc before the readings
    trace = load_trace(tmp_path / "t.memdoc")

    tree = trace.per_step(Metric.HOST_ANON)

    assert not any(s.exact for s in tree)
    assert tree[14].baseline == 160 * MiB  # the sample at 1.0 s, not the step's 1.5 s
    curve = host_curve(trace)
    assert curve is not None and len(measured_baselines(trace, curve)) == 4  # one a sample


def test_a_fast_leak_under_memdoc_run_is_measured_step_by_step(tmp_path: Path) -> None:
    """60 steps of a few ms each: between two of memdoc's samples, so before the readings
    there were too few baselines for any growth rate."""
    program = tmp_path / "fast_leak.py"
    program.write_text(
        textwrap.dedent(
            """
            import time
            import memdoc
            kept = []
            for _ in range(60):
                kept.append(bytearray(1 << 20))  # 1 MiB kept a step, touched
                time.sleep(0.002)
                memdoc.step()
            """
        )
    )
    trace_path = tmp_path / "run.memdoc"
    done = run_memdoc("run", "-q", "-o", str(trace_path), str(program), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]

    trace = load_trace(trace_path)
    curve = host_curve(trace)
    assert curve is not None and curve.metric == Metric.HOST_ANON
    measured = measured_baselines(trace, curve)
    assert len(measured) == 60
    rises = sorted(b - a for (_, a), (_, b) in zip(measured, measured[1:], strict=False))
    assert abs(rises[len(rises) // 2] - MiB) < 0.1 * MiB  # the median step keeps 1 MiB


class _Events:
    """A sink that keeps the step events, and drops everything else."""

    def __init__(self) -> None:
        self.steps: list[Event] = []

    def event(self, event: Event) -> None:
        if event.kind == EventKind.STEP:
            self.steps.append(event)

    def samples(self, *args: object) -> None: ...

    def device(self, *args: object) -> None: ...

    def process(self, *args: object) -> None: ...

    def collector(self, *args: object) -> None: ...


def _free_behind_a_kept_block() -> bytearray:
    """Free 64 MiB of blocks the C heap keeps, resident, behind the last one, kept."""
    blocks = [bytearray(64 << 10) for _ in range(1024)]  # 64 KiB each: from the heap
    kept = blocks.pop()
    del blocks
    return kept


@pytest.mark.skipif(trim_heap() is False, reason="glibc's malloc_trim")
def test_a_step_reads_what_the_program_holds_when_asked_to_return_the_freed_heap_first() -> None:
    from memdoc.session import Session

    sink = _Events()
    session = Session(sink)  # type: ignore[arg-type]
    kept = _free_behind_a_kept_block()
    session.step()
    session.trim_heap_at_steps = True
    session.step()
    kept_too = _free_behind_a_kept_block()
    session.step()

    as_kept, returned, returned_again = (e.data[ANON] for e in sink.steps)
    # The heap's freed 64 MiB count until returned; once returned, freeing as much again
    # and reading at the next step does not show it.
    assert as_kept - returned > 48 * MiB
    assert abs(returned_again - returned) < 8 * MiB
    del kept, kept_too
