"""What the dashboard looks like, as SVG snapshots (clock frozen, findings fixed, size fixed).

Regenerate with `pytest tests/tui/test_snapshots.py --snapshot-update` and look at every
changed picture before committing it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from memdoc.rules.base import Finding, Fix
from memdoc.trace import (
    SCHEMA_VERSION,
    CollectorStatus,
    ExitInfo,
    Header,
    Metric,
    SeriesKey,
    TraceWriter,
    load_trace,
)
from memdoc.tui.app import MemdocApp, make_app
from memdoc.tui.sources import ReplaySource, TraceFollowSource
from memdoc.units import GiB
from tests.tui.conftest import DEMO_START_UNIX, ManualClock, fixed_rules, frozen_clock, wait_for

WIDE = (100, 32)
NARROW = (60, 24)
SnapCompare = Callable[..., bool]


def _settled(app: MemdocApp) -> Callable[[Pilot[Any]], Any]:
    """Wait until a frame drawn at the chart's real width and the findings are shown."""

    async def run_before(pilot: Pilot[Any]) -> None:
        def ready() -> bool:
            view = app.view
            return (
                view is not None
                and app.findings_shown > 0
                and (view.chart is None or view.chart.window.columns == app.chart.columns)
            )

        await wait_for(pilot, ready)
        await pilot.pause(0.2)

    return run_before


def _paused_replay(path: Path, at_s: float) -> ReplaySource:
    return ReplaySource(load_trace(path), clock=ManualClock(), paused=True, start_s=at_s)


def test_a_finished_run_that_ran_out_of_memory(demo_trace: Path, snap_compare: SnapCompare) -> None:
    app = make_app(TraceFollowSource(demo_trace), clock=frozen_clock, rules=fixed_rules)
    assert snap_compare(app, terminal_size=WIDE, run_before=_settled(app))


def test_eight_gpus_in_sixty_columns(demo_trace_8: Path, snap_compare: SnapCompare) -> None:
    app = make_app(TraceFollowSource(demo_trace_8), clock=frozen_clock, rules=fixed_rules)
    assert snap_compare(app, terminal_size=NARROW, run_before=_settled(app))


def test_a_replay_paused_mid_run_on_the_fourth_gpu(
    demo_trace_8: Path, snap_compare: SnapCompare
) -> None:
    app = make_app(_paused_replay(demo_trace_8, 19.0), clock=frozen_clock, rules=fixed_rules)
    settle = _settled(app)

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("4")
        await wait_for(pilot, lambda: app.view is not None and app.view.device == 3)
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=WIDE, run_before=run_before)


def test_the_help_screen(demo_trace: Path, snap_compare: SnapCompare) -> None:
    app = make_app(_paused_replay(demo_trace, 10.0), clock=frozen_clock, rules=fixed_rules)
    settle = _settled(app)

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=WIDE, run_before=run_before)


@pytest.fixture
def host_only_trace(tmp_path: Path) -> Path:
    """A CPU-only run on a machine without an NVIDIA driver: host memory under a cgroup."""
    path = tmp_path / "cpu.memdoc"
    header = Header(
        version=SCHEMA_VERSION,
        created_unix=DEMO_START_UNIX,
        memdoc_version="test",
        command=("python", "etl.py"),
    )
    writer = TraceWriter(path, header)
    writer.collector(
        CollectorStatus(
            "nvml",
            False,
            reason="NVML not found: no NVIDIA driver on this machine; showing host memory only",
        )
    )
    for i in range(200):
        rss = (1 + i / 40) * GiB
        writer.samples(
            DEMO_START_UNIX + i * 0.1,
            {
                SeriesKey(Metric.HOST_RSS): rss,
                SeriesKey(Metric.HOST_AVAILABLE): 20 * GiB - rss,
                SeriesKey(Metric.HOST_TOTAL): 24 * GiB,
                SeriesKey(Metric.CGROUP_USAGE): rss + 0.5 * GiB,
                SeriesKey(Metric.CGROUP_LIMIT): 8 * GiB,
            },
        )
    writer.close(ExitInfo(t=DEMO_START_UNIX + 20.0, signal=9))
    return path


HOST_OOM = Finding(
    rule="host-oom",
    code="MD019",
    title="The host, not the GPU, ran out of memory",
    confidence=0.85,
    summary="Killed by SIGKILL with its cgroup at 81% of its 8.0 GiB limit.",
    fixes=(Fix("any", "Give the job more memory, or use less", "--mem=16G"),),
)


def test_a_run_without_a_gpu_in_sixty_columns(
    host_only_trace: Path, snap_compare: SnapCompare
) -> None:
    app = make_app(
        TraceFollowSource(host_only_trace), clock=frozen_clock, rules=lambda trace: [HOST_OOM]
    )
    assert snap_compare(app, terminal_size=NARROW, run_before=_settled(app))
