"""The dashboard's work loop body: poll the source, build the frame, re-run rules now and then."""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from memdoc.rules.base import Finding
from memdoc.trace import Trace
from memdoc.trace.tail import trace_until
from memdoc.tui.sources import SampleSource, SourceState
from memdoc.tui.timeline import EventIndex
from memdoc.tui.view import DashboardView, StatusView, ViewRequest, build_view

RulesFn = Callable[[Trace], Sequence[Finding]]

# Rules read the whole trace: often enough to feel live, rarely enough to cost little.
RULES_INTERVAL_S = 2.0
LOG_LINES = 200
_LOG_CHUNK_BYTES = 1 << 20


def default_rules() -> RulesFn:
    """memdoc's rule engine; no findings while a build has none."""
    try:
        engine = importlib.import_module("memdoc.rules.engine")
    except ModuleNotFoundError as exc:
        if exc.name != "memdoc.rules.engine":
            raise
        return lambda trace: []
    diagnose: RulesFn = engine.diagnose
    return diagnose


@dataclass(frozen=True)
class Frame:
    """One turn of the loop: the frame, and findings when the rules ran this turn."""

    view: DashboardView
    findings: tuple[Finding, ...] | None = None
    rules_error: str | None = None
    behind: bool = False


class Feed:
    """Turns a source into frames. Runs on one worker thread; owns the source's trace there."""

    def __init__(
        self,
        source: SampleSource,
        *,
        rules: RulesFn,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rules_interval_s: float = RULES_INTERVAL_S,
    ) -> None:
        self.source = source
        self._rules = rules
        self._clock = clock
        self._monotonic = monotonic
        self._rules_interval_s = rules_interval_s
        self._events = EventIndex()
        self._trace: Trace | None = None
        self._last_rules = float("-inf")
        self._rules_key: tuple[int, int, int, float] | None = None
        self._last_view: DashboardView | None = None

    def next_frame(self, request: ViewRequest) -> Frame:
        state = self.source.poll()
        try:
            view = self._build(state, request)
        except Exception as exc:  # a bad record must not take the dashboard down
            return Frame(self._failed_view(state, exc), behind=state.behind)
        self._last_view = view
        findings, error = self._maybe_rules(state)
        return Frame(view, findings, error, behind=state.behind)

    def rules_now(self) -> None:
        """Let the next frame re-run the rules whatever the interval (after a seek)."""
        self._last_rules = float("-inf")

    def _build(self, state: SourceState, request: ViewRequest) -> DashboardView:
        if state.trace is not self._trace:
            self._trace = state.trace
            self._events = EventIndex()
            self._rules_key = None
        if state.trace is not None:
            self._events.update(state.trace)
        return build_view(state, self._events, request, self._clock())

    def _maybe_rules(self, state: SourceState) -> tuple[tuple[Finding, ...] | None, str | None]:
        trace = state.trace
        now = self._monotonic()
        if trace is None or now - self._last_rules < self._rules_interval_s:
            return None, None
        key = (id(trace), trace.values_read, len(self._events.ooms), round(state.now_t, 1))
        if key == self._rules_key:
            return None, None
        self._last_rules, self._rules_key = now, key
        shown = trace if state.now_t >= trace.duration_s else trace_until(trace, state.now_t)
        try:
            findings = self._rules(shown)
        except Exception as exc:  # a rule's bug must not end the session
            return None, f"the rules failed: {type(exc).__name__}: {exc}"
        failed = getattr(findings, "warnings", None)  # rules that failed, named (Findings)
        error = "; ".join(failed) if failed else None
        return tuple(sorted(findings, key=lambda f: -f.confidence)), error

    def _failed_view(self, state: SourceState, exc: Exception) -> DashboardView:
        error = f"cannot show this frame: {type(exc).__name__}: {exc}"
        if self._last_view is not None:
            status = dataclasses.replace(self._last_view.status, error=error)
            return dataclasses.replace(self._last_view, status=status)
        status = StatusView(kind=state.kind, label=state.label, command="", now_t=0.0, error=error)
        return DashboardView(status=status)


class LogTail:
    """The last lines of the wrapped program's output log, read incrementally."""

    def __init__(self, path: Path, max_lines: int = LOG_LINES) -> None:
        self.path = path
        self.max_lines = max_lines
        self._offset = 0
        self._partial = ""
        self._lines: list[str] = []

    def poll(self) -> tuple[str, ...] | None:
        """The last lines when something new arrived, else None."""
        try:
            with open(self.path, "rb") as stream:
                stream.seek(self._offset)
                data = stream.read(_LOG_CHUNK_BYTES)
        except OSError:
            return None
        if not data:
            return None
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        *complete, self._partial = text.split("\n")
        # A progress bar rewrites its line with \r: keep what the terminal would show.
        self._lines.extend(line.rsplit("\r", 1)[-1] for line in complete)
        del self._lines[: -self.max_lines]
        shown = [*self._lines, self._partial.rsplit("\r", 1)[-1]] if self._partial else self._lines
        return tuple(shown[-self.max_lines :])
