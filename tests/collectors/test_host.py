"""The host collector: process-tree RSS, system memory and the cgroup, read for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memdoc.collectors.host import HostCollector, cgroup_from_lines
from memdoc.trace import EventKind, Metric, SeriesKey
from tests.cgroups import real_memory_cgroup

MiB = 1024**2


class _Sink:
    def __init__(self) -> None:
        self.processes: list = []
        self.events: list = []

    def process(self, p):  # noqa: ANN001
        self.processes.append(p)

    def event(self, e):  # noqa: ANN001
        self.events.append(e)

    def samples(self, t, v):  # noqa: ANN001
        pass

    def device(self, d):  # noqa: ANN001
        pass

    def collector(self, s):  # noqa: ANN001
        pass


def test_children_are_found_their_rss_summed_and_their_exit_noticed() -> None:
    # 64 MiB written (resident, the program's own), then "ready", then 1 s of life.
    code = "import sys, time; x = b'1' * (64 << 20); print('ready', flush=True); time.sleep(1.0)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        collector = HostCollector(os.getpid())
        sink = _Sink()
        assert collector.probe().available
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        collector.start(sink)
        values = collector.sample(time.time())
    finally:
        child.wait()

    assert values[SeriesKey(Metric.HOST_RSS, pid=child.pid)] >= 64 * MiB
    # Of which the program's own: the 64 MiB, not the interpreter's mapped files.
    own = values[SeriesKey(Metric.HOST_ANON, pid=child.pid)]
    assert 64 * MiB <= own < values[SeriesKey(Metric.HOST_RSS, pid=child.pid)]
    assert values[SeriesKey(Metric.HOST_ANON)] >= own
    assert (
        values[SeriesKey(Metric.HOST_RSS)]
        >= values[SeriesKey(Metric.HOST_RSS, pid=os.getpid())] + 64 * MiB
    )
    assert values[SeriesKey(Metric.HOST_TOTAL)] > values[SeriesKey(Metric.HOST_AVAILABLE)] > 0
    assert [p.pid for p in sink.processes] == [child.pid]

    collector.sample(time.time() + 5)
    kinds = [e.kind for e in sink.events if e.kind.startswith("process")]
    assert kinds == ["process_start", "process_exit"]


def test_a_process_that_does_not_exist_is_unavailable_with_the_reason() -> None:
    status = HostCollector(2**22 + 4321).probe()

    assert not status.available
    assert "cannot read process" in (status.reason or "")


@pytest.mark.parametrize("version", [1, 2])
def test_cgroup_limit_usage_and_oom_kills_are_read_for_v1_and_v2(
    tmp_path: Path, version: int
) -> None:
    if version == 2:
        base = tmp_path / "job.slice"
        base.mkdir()
        (base / "memory.current").write_text("1048576\n")
        (base / "memory.max").write_text("4194304\n")
        (base / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
        lines = ["0::/job.slice"]
    else:
        base = tmp_path / "memory" / "job"
        base.mkdir(parents=True)
        (base / "memory.usage_in_bytes").write_text("1048576\n")
        (base / "memory.limit_in_bytes").write_text("4194304\n")
        (base / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
        lines = ["12:cpu:/job", "7:memory:/job"]

    cgroup = cgroup_from_lines(lines, tmp_path)

    assert cgroup is not None and cgroup.version == version
    assert cgroup.read() == {
        SeriesKey(Metric.CGROUP_USAGE): 1048576,
        SeriesKey(Metric.CGROUP_LIMIT): 4194304,
        SeriesKey(Metric.CGROUP_OOM_KILLS): 1,
    }


def test_an_unlimited_cgroup_has_no_limit_value(tmp_path: Path) -> None:
    base = tmp_path / "memory"
    base.mkdir()
    (base / "memory.usage_in_bytes").write_text("5\n")
    (base / "memory.limit_in_bytes").write_text("9223372036854771712\n")

    cgroup = cgroup_from_lines(["4:memory:/"], tmp_path)

    assert cgroup is not None
    assert SeriesKey(Metric.CGROUP_LIMIT) not in cgroup.read()


def test_an_address_space_cap_set_by_the_program_is_recorded_for_its_process() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import resource, time; cap = 900 * 1024 * 1024;"
            "resource.setrlimit(resource.RLIMIT_AS, (cap, cap)); time.sleep(1.5)",
        ]
    )
    try:
        collector = HostCollector(child.pid, include_children=False)
        collector.start(_Sink())
        time.sleep(0.8)
        values = collector.sample(time.time())
    finally:
        child.wait()

    assert values[SeriesKey(Metric.HOST_RLIMIT_AS, pid=child.pid)] == 900 * MiB


def test_an_unlimited_address_space_records_no_cap() -> None:
    from memdoc.collectors.host import address_space_limit

    assert address_space_limit(os.getpid()) is None


def test_a_program_that_moves_into_another_cgroup_is_followed(tmp_path: Path, monkeypatch) -> None:
    import memdoc.collectors.host as host

    first, second = tmp_path / "a", tmp_path / "b"
    for folder, limit in ((first, 8 * MiB), (second, 4 * MiB)):
        folder.mkdir()
        (folder / "memory.current").write_text("1024\n")
        (folder / "memory.max").write_text(f"{limit}\n")
        (folder / "memory.events").write_text("oom_kill 0\n")
    where = {"now": host.CgroupFiles(2, first, tmp_path)}
    monkeypatch.setattr(host, "find_cgroup", lambda pid, root=None: where["now"])
    collector = HostCollector(os.getpid())
    collector.start(_Sink())
    t0 = time.time()
    assert collector.sample(t0)[SeriesKey(Metric.CGROUP_LIMIT)] == 8 * MiB

    where["now"] = host.CgroupFiles(2, second, tmp_path)
    values = collector.sample(t0 + 2.0)

    assert values[SeriesKey(Metric.CGROUP_LIMIT)] == 4 * MiB


def _sleeper(seconds: float = 30.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_a_limit_set_on_a_cgroup_above_the_jobs_bounds_it_and_is_named() -> None:
    # GIVEN a job in a cgroup without a limit, below one limited to 256 MiB
    with real_memory_cgroup() as parent:
        parent.limit(256 * MiB)
        inner = parent.child("step")
        job = _sleeper()
        try:
            inner.add(job.pid)
            collector = HostCollector(job.pid)
            sink = _Sink()
            collector.start(sink)
            # WHEN it is sampled
            values = collector.sample(time.time())
        finally:
            job.kill()
            job.wait()

    # THEN the parent's limit is the job's, and the trace says which cgroup set it
    assert values[SeriesKey(Metric.CGROUP_LIMIT)] == 256 * MiB
    (said,) = [e for e in sink.events if e.kind == EventKind.CGROUP]
    assert said.data["path"] == inner.path
    assert said.data["limit_cgroup"] == parent.path
    assert said.data["limit_bytes"] == 256 * MiB


def test_processes_in_the_jobs_cgroup_that_are_not_the_jobs_are_counted() -> None:
    with real_memory_cgroup() as shared:
        job, other = _sleeper(), _sleeper()
        try:
            shared.add(job.pid)
            collector = HostCollector(job.pid)
            collector.start(_Sink())
            alone = collector.sample(time.time())
            shared.add(other.pid)
            together = collector.sample(time.time() + 2.0)
        finally:
            for proc in (job, other):
                proc.kill()
                proc.wait()

    assert alone[SeriesKey(Metric.CGROUP_OTHER_PROCESSES)] == 0
    assert together[SeriesKey(Metric.CGROUP_OTHER_PROCESSES)] == 1
