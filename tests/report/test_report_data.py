"""The computed report: what happened, per-step tables, timeline, and ranks, from real traces."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memdoc.report.data import ReportData
from memdoc.report.overview import ending_of
from memdoc.rules.engine import diagnose_run
from memdoc.trace import (
    SCHEMA_VERSION,
    Event,
    EventKind,
    ExitInfo,
    Header,
    Metric,
    OomInfo,
    Trace,
    load_run,
)
from memdoc.units import GiB
from tests.report.traces import (
    PID,
    SNAPSHOT,
    T0,
    write_clean_h200_run,
    write_host_only_run,
    write_oom_run,
    write_rank_traces,
)


def _report(*paths: Path) -> ReportData:
    run = load_run(list(paths))
    return ReportData.from_run(run, diagnose_run(run))


def test_an_oom_run_says_how_it_ended_and_explains_the_error(tmp_path: Path) -> None:
    data = _report(write_oom_run(tmp_path / "run.memdoc"))

    ending = data.overview.ending
    assert (ending.kind, ending.bad) == ("oom", True)
    assert ending.text == "Ran out of GPU memory on GPU 0"
    assert data.oom is not None and data.oom.info.requested_bytes == 226 * 1024**2
    assert "226 MiB" in data.oom.words
    assert data.oom.stack[-1] == "model.py:40:forward"
    assert data.overview.frameworks == (("pytorch", "2.5.1"),)
    assert data.overview.command == "train.py --batch-size 64"


def test_findings_come_best_first(tmp_path: Path) -> None:
    data = _report(write_oom_run(tmp_path / "run.memdoc"))

    confidences = [f.confidence for f in data.findings]
    assert confidences and confidences == sorted(confidences, reverse=True)
    assert data.findings[0].rule == "leak-across-steps"


def test_the_per_step_table_is_the_traces_own_per_step_query(tmp_path: Path) -> None:
    path = write_oom_run(tmp_path / "run.memdoc")
    trace = load_run([path]).primary

    gpu, host = _report(path).steps

    assert (gpu.metric, gpu.device) == ("torch.allocated", 0)
    assert list(gpu.rows) == trace.per_step("torch.allocated", 0, PID)
    assert list(host.rows) == trace.per_step(Metric.HOST_RSS)
    assert len(gpu.rows) == 46
    # The trace leaks 0.104 GiB a step after the optimizer's first-step jump.
    assert gpu.growth_bytes_per_step == pytest.approx(0.104 * GiB, rel=0.01)
    assert gpu.start_bytes is not None and gpu.rows[0].baseline is not None
    assert gpu.rows[0].baseline - gpu.start_bytes > 2 * GiB, "the optimizer's jump shows"


def test_downsampled_timeline_lines_keep_each_series_peak(tmp_path: Path) -> None:
    path = write_clean_h200_run(tmp_path / "run.memdoc", devices=2, steps=60)
    trace = load_run([path]).primary

    data = ReportData.from_run(load_run([path]), [], max_points=40)

    gpu1 = next(p for p in data.timeline.panels if p.device == 1)
    peak_line = next(line for line in gpu1.lines if line.role == "peak")
    series = trace.series("torch.allocated_peak", 1, PID)
    assert series is not None and series.max() is not None
    assert len(peak_line.values_bytes) <= 40 < peak_line.recorded
    assert max(peak_line.values_bytes) == series.max()[1]  # type: ignore[index]


def test_the_timeline_has_a_panel_per_gpu_and_one_for_the_host(tmp_path: Path) -> None:
    data = _report(write_clean_h200_run(tmp_path / "run.memdoc", devices=2))

    assert [p.key for p in data.timeline.panels] == ["device0", "device1", "host"]
    assert [m.label for m in data.timeline.markers] == ["eval", "eval", "eval"]
    assert len(data.timeline.step_times_s) == 60


def test_a_clean_run_ends_well_and_names_its_gpus(tmp_path: Path) -> None:
    data = _report(write_clean_h200_run(tmp_path / "run.memdoc", devices=2))

    assert (data.overview.ending.kind, data.overview.ending.bad) == ("ok", False)
    assert data.oom is None
    assert [(g.index, g.name) for g in data.overview.gpus] == [
        (0, "NVIDIA H200"),
        (1, "NVIDIA H200"),
    ]
    assert all(g.peak_held_bytes and g.peak_held_bytes > 80 * GiB for g in data.overview.gpus)


def test_a_host_only_run_still_has_timeline_steps_and_findings(tmp_path: Path) -> None:
    data = _report(write_host_only_run(tmp_path / "run.memdoc"))

    assert data.overview.ending.kind == "killed"
    assert data.overview.ending.text.startswith("Killed by SIGKILL (signal 9)")
    assert data.ledgers == ()
    assert [p.key for p in data.timeline.panels] == ["host"]
    assert [t.metric for t in data.steps] == [Metric.HOST_RSS]
    assert data.overview.unavailable[0][0] == "nvml"
    assert "host-oom" in {f.rule for f in data.findings}


def test_ranks_line_up_and_the_first_failure_is_marked(tmp_path: Path) -> None:
    data = _report(*write_rank_traces(tmp_path, world=4, failing_rank=2))

    assert [r.rank for r in data.ranks] == [0, 1, 2, 3]
    assert [r.failed_first for r in data.ranks] == [False, False, True, False]
    assert data.overview.rank == 2, "the report leads with the rank that failed first"
    assert [round(r.offset_s, 2) for r in data.ranks] == [0.0, 0.05, 0.1, 0.15]
    assert all(r.line is not None and r.line.times_s[0] >= r.offset_s for r in data.ranks)


def test_a_single_trace_has_no_rank_section(tmp_path: Path) -> None:
    assert _report(write_oom_run(tmp_path / "run.memdoc")).ranks == ()


def test_without_a_snapshot_there_is_no_allocation_section(tmp_path: Path) -> None:
    assert _report(write_oom_run(tmp_path / "run.memdoc")).allocations is None


def test_a_referenced_snapshot_gives_allocation_sites_and_the_pool(tmp_path: Path) -> None:
    # A real snapshot taken by PyTorch's OOM observer (see the fixture's SOURCES.md).
    shutil.copy(SNAPSHOT, tmp_path / "run.oom.pickle")
    trace = write_oom_run(tmp_path / "run.memdoc", snapshot="run.oom.pickle")

    allocs = _report(trace).allocations

    assert allocs is not None and allocs.reason == "oom"
    assert allocs.sites, "live memory grouped by source line"
    shares = [s.share for s in allocs.sites]
    assert shares == sorted(shares, reverse=True)
    assert sum(s.bytes for s in allocs.sites) + allocs.other_bytes == allocs.live_bytes
    assert allocs.fragmentation.reserved_bytes == pytest.approx(11.0 * GiB, rel=0.02)


def test_a_snapshot_that_cannot_be_read_is_left_out_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "run.oom.pickle").write_bytes(b"not a pickle")
    trace = write_oom_run(tmp_path / "run.memdoc", snapshot="run.oom.pickle")

    data = _report(trace)

    assert data.allocations is None
    assert any("run.oom.pickle" in w for w in data.warnings)


def _ended(end: ExitInfo | None, *events: Event, mode: str = "run") -> tuple[str, str, bool]:
    header = Header(version=SCHEMA_VERSION, created_unix=T0, memdoc_version="0", mode=mode, pid=PID)
    trace = Trace(header)
    for event in events:
        trace.add_event(event)
    trace.exit = end
    ending = ending_of(trace)
    return ending.kind, ending.text, ending.bad


INCOMPLETE = "The trace has no end record: memdoc or the machine stopped before the program ended"
IMPORTED = "Imported from another tool's files: no end recorded"
CAUGHT_OOM = Event(1.0, EventKind.OOM, PID, {"oom": OomInfo(device=0).to_dict(), "handled": True})
# What `memdoc run` reads from the program's stderr: no process, nothing says "handled".
LOGGED_OOM = Event(
    1.0, EventKind.OOM, None, {"oom": OomInfo(framework="host", kind="host-alloc").to_dict()}
)
# TensorFlow's BFC dump of that same OOM, read from stderr at the end.
STDERR_DUMP = Event(
    2.5,
    EventKind.OOM,
    PID,
    {"oom": OomInfo(framework="tensorflow").to_dict(), "source": "stderr", "dump": "..."},
)
ERROR = Event(2.0, EventKind.EXCEPTION, PID, {"type": "ValueError"})


@pytest.mark.parametrize(
    ("end", "events", "mode", "expected"),
    [
        pytest.param(
            ExitInfo(3.0, exit_code=0),
            (),
            "run",
            ("ok", "Finished normally after 3.0s", False),
            id="clean",
        ),
        pytest.param(
            ExitInfo(3.0, exit_code=1),
            (ERROR,),
            "watch",
            ("error", "Failed with exit code 1 (uncaught ValueError) after 3.0s", True),
            id="uncaught exception",
        ),
        pytest.param(
            ExitInfo(3.0, exit_code=7),
            (Event(2.0, EventKind.EXCEPTION, PID + 1, {"type": "ValueError"}),),
            "run",
            ("error", "Failed with exit code 7 after 3.0s", True),
            id="a child's exception is not the program's",
        ),
        pytest.param(
            ExitInfo(3.0, signal=15),
            (),
            "run",
            ("signal", "Ended by SIGTERM (signal 15) after 3.0s", True),
            id="sigterm",
        ),
        pytest.param(
            ExitInfo(3.0, exit_code=0),
            (CAUGHT_OOM,),
            "run",
            ("ok", "1 OOM caught and survived; the run exited 0 after 3.0s", False),
            id="oom caught by the program",
        ),
        pytest.param(
            ExitInfo(3.0, exit_code=0),
            (LOGGED_OOM, LOGGED_OOM),
            "run",
            ("ok", "2 OOMs caught and survived; the run exited 0 after 3.0s", False),
            id="ooms the program logged, then exited 0",
        ),
        pytest.param(
            ExitInfo(3.0, exit_code=0),
            (CAUGHT_OOM, STDERR_DUMP),
            "run",
            ("ok", "1 OOM caught and survived; the run exited 0 after 3.0s", False),
            id="a caught oom and its allocator dump from stderr",
        ),
        pytest.param(
            ExitInfo(3.0, exit_code=1),
            (CAUGHT_OOM,),
            "run",
            ("oom", "Ran out of GPU memory on GPU 0", True),
            id="oom caught, then failed",
        ),
        pytest.param(None, (), "run", ("incomplete", INCOMPLETE, True), id="no end record"),
        pytest.param(None, (), "import", ("imported", IMPORTED, False), id="imported"),
    ],
)
def test_how_a_run_ended_is_said_in_one_sentence(
    end: ExitInfo | None, events: tuple[Event, ...], mode: str, expected: tuple[str, str, bool]
) -> None:
    assert _ended(end, *events, mode=mode) == expected


@pytest.mark.parametrize(("exit_code", "survived"), [(0, True), (1, False)])
def test_an_oom_caught_and_then_let_out_is_not_called_survived(
    exit_code: int, survived: bool
) -> None:
    from memdoc.report.data import oom_view

    trace = Trace(
        Header(version=SCHEMA_VERSION, created_unix=T0, memdoc_version="0", mode="run", pid=PID)
    )
    trace.add_event(CAUGHT_OOM)  # a loop caught it, cleaned up, and raised it again
    trace.exit = ExitInfo(3.0, exit_code=exit_code)

    view = oom_view(trace)

    assert view is not None and view.handled is survived


@pytest.mark.parametrize(
    ("mode", "steps", "said"),
    [
        ("run", 128, "128"),
        ("run", 3, "3 (too few to judge growth across steps)"),
        ("watch", 0, "none reported (too few to judge growth across steps)"),
        ("import", 0, ""),
        ("text", 0, ""),
    ],
)
def test_a_recording_says_when_its_steps_were_too_few_to_judge_growth(
    mode: str, steps: int, said: str
) -> None:
    import dataclasses

    from memdoc.report.overview import build_overview, steps_words

    trace = Trace(
        Header(version=SCHEMA_VERSION, created_unix=T0, memdoc_version="0", mode=mode, pid=PID)
    )
    overview = dataclasses.replace(build_overview(trace), steps=steps)

    assert steps_words(overview) == said
