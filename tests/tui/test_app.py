"""The dashboard driven by keys, as a person would, through Textual's Pilot."""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from memdoc.trace import (
    SCHEMA_VERSION,
    DeviceInfo,
    Header,
    SeriesKey,
    TraceWriter,
    load_trace,
)
from memdoc.trace.ledger import ALLOCATED, Ledger
from memdoc.tui.app import KEYS, MemdocApp, make_app
from memdoc.tui.html_report import open_in_browser
from memdoc.tui.ledger import DeviceBar
from memdoc.tui.screens.help import HelpScreen, bindings_table
from memdoc.tui.sources import ReplaySource, TraceFollowSource
from memdoc.tui.view import DashboardView
from memdoc.units import GiB
from tests.tui.conftest import (
    FINDINGS,
    ManualClock,
    drive,
    fixed_rules,
    frozen_clock,
    no_rules,
    wait_for,
)

SIZE = (100, 32)


def shown(app: MemdocApp) -> DashboardView:
    """The frame on screen (after the first one has arrived)."""
    assert app.view is not None
    return app.view


def device_ledger(app: MemdocApp) -> Ledger:
    bar = shown(app).ledger
    assert isinstance(bar, DeviceBar)
    return bar.ledger


def chart_span_s(app: MemdocApp) -> tuple[float, float]:
    chart = shown(app).chart
    assert chart is not None
    return chart.window.t0_s, chart.window.t1_s


def log_text(app: MemdocApp) -> str:
    assert app.program_log is not None
    return str(app.program_log.render())


def _replay(trace_path: Path, clock: ManualClock | None = None, **kwargs: object) -> ReplaySource:
    return ReplaySource(load_trace(trace_path), clock=clock or ManualClock(), **kwargs)  # type: ignore[arg-type]


@drive
async def test_device_keys_switch_the_device_shown(demo_trace_8: Path) -> None:
    app = make_app(_replay(demo_trace_8, paused=True, start_s=10.0), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None and shown(app).device == 0)
        for key, device in (
            ("right_square_bracket", 1),
            ("left_square_bracket", 0),
            ("left_square_bracket", 7),
            ("4", 3),
            ("8", 7),
            ("1", 0),
        ):
            await pilot.press(key)
            await wait_for(pilot, lambda d=device: shown(app).device == d)
        await pilot.press("9")  # no ninth device key: nothing changes
        await pilot.pause(0.3)
        assert app.view is not None and shown(app).device == 0
        assert [r.pid for r in shown(app).processes][0] == 4243


@drive
async def test_space_and_p_pause_and_resume_a_replay(demo_trace: Path) -> None:
    clock = ManualClock()
    app = make_app(_replay(demo_trace, clock, start_s=5.0), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        await pilot.press("space")
        await wait_for(pilot, lambda: shown(app).status.paused)
        clock.advance(3.0)
        await pilot.pause(0.4)
        assert shown(app).status.now_t == pytest.approx(5.0)
        await pilot.press("p")
        clock.advance(3.0)
        await wait_for(pilot, lambda: shown(app).status.now_t == pytest.approx(8.0))
        assert not shown(app).status.paused


@drive
async def test_replay_keys_change_speed_and_seek(demo_trace: Path) -> None:
    source = _replay(demo_trace, paused=True, start_s=10.0)
    app = make_app(source, rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        await pilot.press("plus", "plus")
        assert source.speed == 4.0
        await pilot.press("minus")
        assert source.speed == 2.0
        await pilot.press("right")
        await wait_for(pilot, lambda: shown(app).status.now_t == pytest.approx(15.0))
        await pilot.press("left", "left", "left", "left")
        await wait_for(pilot, lambda: shown(app).status.now_t == 0.0)
        await pilot.press("end")
        await wait_for(pilot, lambda: shown(app).oom is not None)
        assert "2x" in app.header.lines(98)[1].plain
        await pilot.press("home")
        await wait_for(pilot, lambda: shown(app).oom is None)


@drive
async def test_replay_keys_are_off_while_following(demo_trace: Path) -> None:
    app = make_app(TraceFollowSource(demo_trace), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        assert app.check_action("seek", (5.0,)) is False
        assert app.check_action("change_speed", (1,)) is False
        assert app.check_action("toggle_pause", ()) is True
        footer = " ".join(
            active.binding.description
            for active in app.active_bindings.values()
            if active.binding.show and active.enabled
        )
        assert "Pause" in footer and "Faster" not in footer


@drive
async def test_help_lists_every_binding_and_closes_again(demo_trace: Path) -> None:
    app = make_app(TraceFollowSource(demo_trace), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        screen = app.screen
        assert isinstance(screen, HelpScreen)
        console = Console(width=100, record=True, file=io.StringIO())
        console.print(bindings_table(screen.rows))
        shown = console.export_text()
        for key in KEYS:
            if not key.action.startswith("select_device"):
                assert key.description in shown
        assert "1…8" in shown and "Show the GPU in that place" in shown
        assert "Keys" in app.export_screenshot()
        frames = app.frames_shown
        await wait_for(pilot, lambda: app.frames_shown > frames)  # frames go on under help
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))


@drive
async def test_findings_appear_as_the_rules_fire_and_the_banner_gives_the_diagnosis(
    demo_trace: Path,
) -> None:
    def rules_that_need_the_oom(trace):  # type: ignore[no-untyped-def]
        return list(FINDINGS) if trace.ending_oom() is not None else []

    app = make_app(_replay(demo_trace, paused=True, start_s=10.0), rules=rules_that_need_the_oom)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.findings == ())
        assert not app.banner.has_class("-visible")
        await pilot.press("end")
        await wait_for(pilot, lambda: app.findings == FINDINGS)
        banner = str(app.banner.render())
        assert "OUT OF MEMORY" in banner and "tried to allocate 4.0 GiB" in banner
        assert FINDINGS[0].title in banner and "expandable_segments:True" in banner
        assert app.banner.has_class("-visible")


@drive
async def test_following_picks_up_samples_appended_while_it_runs(tmp_path: Path) -> None:
    path = tmp_path / "growing.memdoc"
    t0 = time.time()
    header = Header(version=SCHEMA_VERSION, created_unix=t0, memdoc_version="test")
    writer = TraceWriter(path, header)
    writer.device(DeviceInfo(0, "NVIDIA H100 80GB HBM3", 80 * GiB))
    key = SeriesKey("torch.allocated", device=0, pid=7)
    writer.samples(t0 + 0.1, {key: 1 * GiB, SeriesKey("torch.reserved", 0, 7): 2 * GiB})
    writer.close()  # flushed; the file stays open for appends below, as a writer's would
    app = make_app(TraceFollowSource(path), rules=no_rules, clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None and shown(app).ledger is not None)
        assert device_ledger(app).term(ALLOCATED) == 1 * GiB
        assert shown(app).status.live
        with path.open("a") as stream:
            stream.write(f"[{0.5},0,{5 * GiB}]\n")
        await wait_for(pilot, lambda: device_ledger(app).term(ALLOCATED) == 5 * GiB)
        with path.open("a") as stream:
            stream.write('{"type":"end","t":0.6,"exit_code":0}\n')
        await wait_for(pilot, lambda: not shown(app).status.live)
        assert "finished" in app.header.lines(98)[1].plain


@drive
async def test_a_damaged_line_in_a_followed_trace_is_counted_not_fatal(
    tmp_path: Path, demo_trace: Path
) -> None:
    lines = demo_trace.read_bytes().splitlines(keepends=True)
    path = tmp_path / "damaged.memdoc"
    path.write_bytes(b"".join(lines[:60]))
    app = make_app(TraceFollowSource(path), rules=no_rules, clock=frozen_clock)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None and shown(app).status.now_t > 0)
        with path.open("ab") as stream:
            stream.write(b'[3.0,{"oops":\n\x00\x01garbage\xff\n')
            stream.write(b"".join(lines[60:]))
        await wait_for(pilot, lambda: shown(app).oom is not None)
        assert shown(app).status.damaged_lines == 2
        assert "2 damaged line(s) skipped" in app.header.lines(98)[1].plain


@drive
async def test_the_window_key_cycles_the_time_span(demo_trace: Path) -> None:
    app = make_app(TraceFollowSource(demo_trace), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None and shown(app).chart is not None)
        await pilot.press("w")
        await wait_for(
            pilot,
            lambda: (
                shown(app).chart.window.t1_s - shown(app).chart.window.t0_s == pytest.approx(300.0)
            ),
        )
        await pilot.press("w", "w")
        await wait_for(pilot, lambda: chart_span_s(app)[0] == 0.0)


@drive
async def test_quit_ends_the_app_with_status_zero(demo_trace: Path) -> None:
    app = make_app(TraceFollowSource(demo_trace), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        await pilot.press("q")
        await pilot.pause(0.1)
    assert app.return_code == 0


@drive
async def test_the_program_output_log_is_shown_as_it_grows(
    tmp_path: Path, demo_trace: Path
) -> None:
    log = tmp_path / "run.log"
    log.write_text("epoch 1 loss 2.31\n")
    app = make_app(TraceFollowSource(demo_trace), rules=no_rules, log_path=log)
    async with app.run_test(size=SIZE) as pilot:
        assert app.program_log is not None
        await wait_for(pilot, lambda: "epoch 1" in log_text(app))
        with log.open("a") as stream:
            stream.write("epoch 2 loss 1.97\rprogress 50%\rprogress 100%\n")
        await wait_for(pilot, lambda: "progress 100%" in log_text(app))
        assert "progress 50%" not in log_text(app)


@pytest.mark.slow
@drive
async def test_the_report_key_writes_the_html_report_beside_the_trace_and_says_where(
    demo_trace: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "run.memdoc"
    shutil.copyfile(demo_trace, trace)
    opened: list[str] = []

    def no_browser(uri: str) -> bool:
        opened.append(uri)
        return False

    app = make_app(TraceFollowSource(trace), rules=fixed_rules, opener=no_browser)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        for presses in (1, 2):
            await pilot.press("r")
            await wait_for(pilot, lambda: len(opened) == presses, timeout_s=60.0)  # noqa: B023
        await pilot.pause(0.1)
        reports = [Path(uri.removeprefix("file://")) for uri in opened]
        # The second report does not overwrite the first.
        assert reports == [tmp_path / "run.html", tmp_path / "run-1.html"]
        assert all("<html" in r.read_text(errors="replace").lower() for r in reports)
        messages = [n.message for n in app._notifications]
        assert any(f"written to {reports[1]}" in m for m in messages)


@pytest.mark.slow
@drive
async def test_the_report_key_works_on_a_trace_given_by_a_relative_path(
    demo_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copyfile(demo_trace, tmp_path / "memdoc-20240101-000000-1.memdoc")
    monkeypatch.chdir(tmp_path)
    opened: list[str] = []

    def no_browser(uri: str) -> bool:
        opened.append(uri)
        return False

    source = TraceFollowSource(Path("memdoc-20240101-000000-1.memdoc"))
    app = make_app(source, rules=fixed_rules, opener=no_browser)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        await pilot.press("r")
        await wait_for(pilot, lambda: len(opened) == 1, timeout_s=60.0)
        await pilot.pause(0.1)
        assert app.is_running
    report = tmp_path / "memdoc-20240101-000000-1.html"
    assert opened == [report.as_uri()] and report.is_file()


def test_no_browser_is_opened_without_a_display(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.platform", "linux")
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        monkeypatch.delenv(name, raising=False)
    called: list[str] = []

    def fake_open(uri: str) -> bool:
        called.append(uri)
        return True

    monkeypatch.setattr("webbrowser.open", fake_open)
    assert open_in_browser("file:///tmp/report.html") is False
    assert called == []


@pytest.mark.parametrize(
    "size", [pytest.param((60, 20), id="60x20"), pytest.param((80, 24), id="80x24")]
)
@drive
async def test_an_oom_banner_in_a_small_terminal_leaves_no_scrollbar_glyphs(
    demo_trace: Path, tmp_path: Path, size: tuple[int, int]
) -> None:
    # GIVEN run --live's layout (the program's output below) in a small terminal
    log = tmp_path / "run.log"
    log.write_text("".join(f"step {i}\n" for i in range(40)))
    app = make_app(TraceFollowSource(demo_trace), rules=fixed_rules, log_path=log)
    async with app.run_test(size=size) as pilot:
        # WHEN the banner shows the OOM and its diagnosis, taking rows from the rest
        await wait_for(pilot, lambda: app.banner.display and app.findings is not None)
        await pilot.pause(0.2)
        # THEN the screen still fits: no scrollbar, whose thumb draws block glyphs at the edge
        assert app.screen.scrollbars_enabled == (False, False)
        assert app.banner.region.height >= 3


def _abandoned_trace(path: Path, *, writer_pid: int, silent_s: float) -> Path:
    """A leaking run whose OOM was forecast, whose last record is `silent_s` old, and which
    was never closed: its writer `writer_pid` died, or is still there."""
    import itertools

    from memdoc.forecast.live import ForecastingSink
    from memdoc.trace.model import Event, EventKind, Metric

    mib, start = 1 << 20, time.time() - silent_s - 60.0
    header = Header(
        version=SCHEMA_VERSION,
        created_unix=start,
        memdoc_version="t",
        host=socket.gethostname(),
        pid=writer_pid,
    )
    writer = TraceWriter(path, header)
    ticks = itertools.count(0, 2.0)
    sink = ForecastingSink(writer, start_unix=start, clock=lambda: float(next(ticks)))
    vms = SeriesKey(Metric.HOST_VMS, pid=writer_pid)
    cap = SeriesKey(Metric.HOST_RLIMIT_AS, pid=writer_pid)
    for step in range(1, 61):
        t = start + step
        sink.samples(t - 0.5, {vms: 300 * mib + 5 * mib * step, cap: 4000 * mib})
        sink.event(Event(t=t, kind=EventKind.STEP, pid=writer_pid, data={"step": step}))
    writer.close()  # no end record: as a killed writer leaves it
    assert load_trace(path).events("forecast")
    return path


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


@drive
async def test_a_trace_whose_writer_died_long_ago_is_shown_ended_with_no_forecast(
    tmp_path: Path,
) -> None:
    path = _abandoned_trace(tmp_path / "run.memdoc", writer_pid=_dead_pid(), silent_s=31 * 60)

    app = make_app(TraceFollowSource(path), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        status = shown(app).status
        assert not status.live
        time_line = app.header.lines(98)[1].plain
        assert "ended" in time_line and "live" not in time_line
        assert shown(app).forecast is None
        assert not app.forecast.has_class("-visible")


@drive
async def test_a_silent_trace_whose_writer_still_runs_stays_live(tmp_path: Path) -> None:
    import psutil

    # A writer that started before its trace: the oldest process there is.
    age_s = time.time() - psutil.Process(1).create_time()
    silent_s = min(31 * 60, age_s - 80)
    if silent_s < 20:
        pytest.skip("no process here is old enough to have written the trace")
    path = _abandoned_trace(tmp_path / "run.memdoc", writer_pid=1, silent_s=silent_s)

    app = make_app(TraceFollowSource(path), rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        assert shown(app).status.live
        assert "no new data for" in app.header.lines(98)[1].plain
