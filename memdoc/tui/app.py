"""The dashboard app and its factory, used alike by `memdoc live`, `memdoc top`, `run --live`."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widgets import Footer
from textual.worker import get_current_worker

from memdoc.printable import printable
from memdoc.rules.base import Finding
from memdoc.tui.feed import Feed, LogTail, RulesFn, default_rules
from memdoc.tui.html_report import open_in_browser, report_path_of, write_report
from memdoc.tui.messages import FindingsUpdated, ProgramOutput, ReportFinished, ViewUpdated
from memdoc.tui.screens.help import HelpScreen
from memdoc.tui.sources import SampleSource, Seekable, TraceFollowSource
from memdoc.tui.view import DashboardView, ViewRequest
from memdoc.tui.widgets.banner import OomBanner
from memdoc.tui.widgets.chart import HistoryChart
from memdoc.tui.widgets.findings import FindingsPanel
from memdoc.tui.widgets.forecast import ForecastLine
from memdoc.tui.widgets.header import RunHeader
from memdoc.tui.widgets.host import HostPanel
from memdoc.tui.widgets.ledger import LedgerBar
from memdoc.tui.widgets.processes import ProcessTable
from memdoc.tui.widgets.program_log import ProgramLog
from memdoc.tui.widgets.recordings import RecordingsPanel
from memdoc.tui.widgets.tabs import DeviceTabs

REFRESH_INTERVAL_S = 0.25  # four frames a second
WINDOWS_S: tuple[float | None, ...] = (60.0, 300.0, 1800.0, None, 15.0)
SEEK_SMALL_S = 5.0
SEEK_LARGE_S = 60.0
MAX_DEVICE_KEYS = 8
INTERRUPTED_STATUS = 130  # what a shell reports for a command ended by Ctrl-C


@dataclass(frozen=True)
class Key:
    """One row of the key map: the binding and the line the help screen shows for it."""

    keys: str
    action: str
    description: str
    display: str | None = None
    footer: bool = True

    def binding(self) -> Binding:
        return Binding(
            self.keys, self.action, self.description, show=self.footer, key_display=self.display
        )


KEYS: tuple[Key, ...] = (
    Key("q", "quit", "Quit"),
    Key("question_mark", "help", "Help", "?"),
    Key("space,p", "toggle_pause", "Pause", "space/p"),
    Key("left_square_bracket", "prev_device", "Prev GPU", "["),
    Key("right_square_bracket", "next_device", "Next GPU", "]"),
    *(
        Key(str(n), f"select_device({n - 1})", f"Show GPU {n - 1}", footer=False)
        for n in range(1, MAX_DEVICE_KEYS + 1)
    ),
    Key("w", "cycle_window", "Time span"),
    Key("r", "report", "Report"),
    Key("minus", "change_speed(-1)", "Slower", "-"),
    Key("plus,equals_sign", "change_speed(1)", "Faster", "+"),
    Key("left", f"seek({-SEEK_SMALL_S})", f"Back {SEEK_SMALL_S:g}s", "←"),
    Key("right", f"seek({SEEK_SMALL_S})", f"Forward {SEEK_SMALL_S:g}s", "→"),
    Key("shift+left", f"seek({-SEEK_LARGE_S})", "Back 1 min", "shift+←", footer=False),
    Key("shift+right", f"seek({SEEK_LARGE_S})", "Forward 1 min", "shift+→", footer=False),
    Key("home", "seek_to_start", "To the start", footer=False),
    Key("end", "seek_to_end", "To the end", footer=False),
)
_REPLAY_ACTIONS = {"change_speed", "seek", "seek_to_start", "seek_to_end"}
_DEVICE_ACTIONS = {"prev_device", "next_device", "select_device"}


class MemdocApp(App[int]):
    """One dashboard for every source: widgets display what the feed worker computed."""

    CSS_PATH = "memdoc.tcss"
    TITLE = "memdoc"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (90, "-wide")]  # noqa: RUF012 - Textual's type
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]  # noqa: RUF012 - Textual's type
    BINDINGS: ClassVar[list[BindingType]] = [
        *(key.binding() for key in KEYS),
        # Textual's own ctrl+c only says to press ctrl+q; a person means "stop".
        Binding("ctrl+c", "interrupt", "Interrupt", show=False, priority=True),
    ]

    def __init__(
        self,
        source: SampleSource,
        *,
        log_path: Path | None = None,
        clock: Callable[[], float] = time.time,
        rules: RulesFn | None = None,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
        opener: Callable[[str], bool] = open_in_browser,
        interrupt: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._interrupt = interrupt
        self.source = source
        self.log_path = log_path
        self.refresh_interval_s = refresh_interval_s
        self.feed = Feed(source, rules=rules or default_rules(), clock=clock)
        self.view: DashboardView | None = None
        self.findings: tuple[Finding, ...] | None = None
        self.frames_shown = 0
        self.findings_shown = 0
        self._opener = opener
        self._request = ViewRequest()
        self._window_index = 0
        self._wake = threading.Event()
        self._log_tail = LogTail(log_path) if log_path is not None else None
        # Kept, not queried: a query searches only the screen on top (help may be open).
        self.header = RunHeader(id="header")
        self.banner = OomBanner(id="oom")
        self.forecast = ForecastLine(id="forecast")
        self.tabs = DeviceTabs(id="tabs")
        self.ledger = LedgerBar(id="ledger")
        self.chart = HistoryChart(id="chart")
        self.processes = ProcessTable(id="processes")
        self.host = HostPanel(id="host")
        self.recordings = RecordingsPanel(id="recordings")
        self.recordings.display = False  # until a frame says its source looks for them
        self.findings_panel = FindingsPanel(id="findings")
        self.program_log = ProgramLog(log_path.name, id="program-log") if log_path else None

    # -- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.banner
        yield self.forecast
        yield self.tabs
        yield self.ledger
        yield self.chart
        with Horizontal(id="bottom"):
            yield self.processes
            with Vertical(id="side"):
                yield self.host
                yield self.recordings
                yield self.findings_panel
        if self.program_log is not None:
            yield self.program_log
        yield Footer()

    def on_mount(self) -> None:
        if self.program_log is not None:
            self.screen.add_class("-with-log")
        self._run_feed()

    def on_unmount(self) -> None:
        self._wake.set()
        self.source.close()

    # -- the feed worker ------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="feed")
    def _run_feed(self) -> None:
        worker = get_current_worker()
        last_post = float("-inf")
        while not worker.is_cancelled:
            frame = self.feed.next_frame(self._request)
            now = time.monotonic()
            # While catching up with a large file, show progress a few times a second only.
            if not frame.behind or now - last_post >= self.refresh_interval_s:
                last_post = now
                self.post_message(ViewUpdated(frame.view))
            if frame.findings is not None or frame.rules_error is not None:
                self.post_message(FindingsUpdated(frame.findings or (), frame.rules_error))
            if self._log_tail is not None and (lines := self._log_tail.poll()) is not None:
                self.post_message(ProgramOutput(lines))
            if not frame.behind:
                self._wake.wait(self.refresh_interval_s)
                self._wake.clear()

    def refresh_now(self) -> None:
        """Compute the next frame at once (after a key press), not at the next tick."""
        self._wake.set()

    # -- messages -------------------------------------------------------------------------

    def on_view_updated(self, message: ViewUpdated) -> None:
        if not self.header.is_attached:
            return  # a frame that arrived while the app closes
        several = len(message.view.tabs) > 1
        if self.view is None or several != (len(self.view.tabs) > 1):
            self.call_later(self.refresh_bindings)  # device keys only where there is a choice
        view = self.view = message.view
        self.header.show(view.status)
        self.banner.show(view.oom, self.findings)
        self.forecast.show(view.forecast)
        self.tabs.show(view.tabs, view.device)
        self.ledger.show(view.ledger, self._device_name(view))
        self.chart.show(view.chart, self._window_label())
        self.processes.show(view.processes, _empty_processes_text(view))
        self.processes.display = bool(view.tabs or view.processes)
        self.host.show(view.host)
        self.recordings.show(view.recordings or ())
        self.recordings.display = view.recordings is not None
        self.frames_shown += 1

    def on_findings_updated(self, message: FindingsUpdated) -> None:
        if not self.findings_panel.is_attached:
            return
        panel = self.findings_panel
        panel.show(message.findings if message.error is None else None, message.error)
        self.findings = panel.findings
        self.findings_shown += 1
        if self.view is not None:
            self.banner.show(self.view.oom, self.findings)

    def on_program_output(self, message: ProgramOutput) -> None:
        if self.program_log is not None and self.program_log.is_attached:
            self.program_log.show(message.lines)

    def on_history_chart_resized(self, message: HistoryChart.Resized) -> None:
        self._set_request(columns=message.columns)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """A notification whose text (paths, errors) is shown as written, never as markup."""
        super().notify(
            printable(message),
            title=printable(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    def on_report_finished(self, message: ReportFinished) -> None:
        if message.path is None:
            self.notify(message.error or "the report failed", title="Report", severity="error")
        elif self._opener(message.path.as_uri()):
            self.notify(f"opened {message.path} in the browser", title="Report")
        else:
            self.notify(f"written to {message.path}", title="Report", timeout=30)

    # -- actions --------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _REPLAY_ACTIONS:
            return isinstance(self.source, Seekable)
        if action in _DEVICE_ACTIONS:
            return self.view is None or len(self.view.tabs) > 1
        if action == "report":
            return report_path_of(self.source) is not None
        return True

    def action_interrupt(self) -> None:
        """Ctrl-C: interrupt the watched program, if there is one, and close the dashboard."""
        if self._interrupt is not None:
            self._interrupt()
        self.exit(return_code=INTERRUPTED_STATUS)

    def action_help(self) -> None:
        rows: list[tuple[str, str, bool]] = []
        for key in KEYS:
            if _name(key.action) == "select_device":
                if key.keys == "1":
                    usable = bool(self.check_action("select_device", ()))
                    rows.append((f"1…{MAX_DEVICE_KEYS}", "Show the GPU in that place", usable))
                continue
            usable = bool(self.check_action(_name(key.action), ()))
            rows.append((key.display or key.keys, key.description, usable))
        self.push_screen(HelpScreen(rows))

    def action_toggle_pause(self) -> None:
        paused = self.view.status.paused if self.view is not None else False
        self.source.set_paused(not paused)
        self.refresh_now()

    def action_next_device(self) -> None:
        self._step_device(1)

    def action_prev_device(self) -> None:
        self._step_device(-1)

    def action_select_device(self, position: int) -> None:
        tabs = self.view.tabs if self.view is not None else ()
        if 0 <= position < len(tabs):
            self._set_request(device=tabs[position].index)

    def action_cycle_window(self) -> None:
        self._window_index = (self._window_index + 1) % len(WINDOWS_S)
        self._set_request(window_s=WINDOWS_S[self._window_index])

    def action_change_speed(self, steps: int) -> None:
        if isinstance(self.source, Seekable):
            speed = self.source.change_speed(steps)
            self.notify(f"replay at {speed:g}x", timeout=1.5)
            self.refresh_now()

    def action_seek(self, delta_s: float) -> None:
        if isinstance(self.source, Seekable):
            self.source.seek_by(delta_s)
            self.feed.rules_now()
            self.refresh_now()

    def action_seek_to_start(self) -> None:
        if isinstance(self.source, Seekable):
            self.source.seek_to(0.0)
            self.feed.rules_now()
            self.refresh_now()

    def action_seek_to_end(self) -> None:
        if isinstance(self.source, Seekable):
            self.source.seek_to(float("inf"))
            self.feed.rules_now()
            self.refresh_now()

    def action_report(self) -> None:
        path = report_path_of(self.source)
        if path is not None:
            self.notify(f"writing the report for {path.name}…", title="Report", timeout=3)
            self._write_report(path)

    @work(thread=True, exclusive=True, group="report")
    def _write_report(self, trace_path: Path) -> None:
        html, error = write_report(trace_path)
        self.post_message(ReportFinished(html, error))

    # -- helpers --------------------------------------------------------------------------

    def _set_request(self, **changes: object) -> None:
        request = dataclasses.replace(self._request, **changes)  # type: ignore[arg-type]
        if request != self._request:
            self._request = request
            self.refresh_now()

    def _step_device(self, step: int) -> None:
        if self.view is None or not self.view.tabs:
            return
        indexes = [tab.index for tab in self.view.tabs]
        current = indexes.index(self.view.device) if self.view.device in indexes else 0
        self._set_request(device=indexes[(current + step) % len(indexes)])

    def _device_name(self, view: DashboardView) -> str:
        for tab in view.tabs:
            if tab.index == view.device:
                return f"GPU {tab.index} · {tab.name}"
        return "Host memory"

    def _window_label(self) -> str:
        span = self._request.window_s
        if span is None:
            return "whole run"
        return f"last {span:g} s" if span < 60 else f"last {span / 60:g} min"


def _empty_processes_text(view: DashboardView) -> str:
    if view.device is None:
        return "no GPU process to show"
    return "no process seen on this device yet"


def _name(action: str) -> str:
    return action.split("(", 1)[0]


def make_app(
    source: SampleSource,
    *,
    log_path: Path | None = None,
    clock: Callable[[], float] = time.time,
    rules: RulesFn | None = None,
    refresh_interval_s: float = REFRESH_INTERVAL_S,
    opener: Callable[[str], bool] = open_in_browser,
    interrupt: Callable[[], None] | None = None,
) -> MemdocApp:
    """The dashboard over `source`; `log_path` is the wrapped program's output, if any;
    `interrupt` is what Ctrl-C does to that program before the dashboard closes."""
    return MemdocApp(
        source,
        log_path=log_path,
        clock=clock,
        rules=rules,
        refresh_interval_s=refresh_interval_s,
        opener=opener,
        interrupt=interrupt,
    )


def run_live_dashboard(
    trace_path: Path,
    *,
    log_path: Path | None = None,
    interrupt: Callable[[], None] | None = None,
) -> int:
    """Follow a trace being written until the person quits (`memdoc run --live`), or until
    `close_running_app` is called on the dashboard's thread."""
    app = make_app(TraceFollowSource(trace_path), log_path=log_path, interrupt=interrupt)
    _RUNNING.append(app)
    try:
        app.run()
    finally:
        _RUNNING.remove(app)
    return app.return_code or 0


_RUNNING: list[MemdocApp] = []  # the live dashboard on screen, while it is


def close_running_app() -> None:
    """Close the live dashboard on screen, if one is (its own thread only)."""
    for app in _RUNNING:
        app.exit()
