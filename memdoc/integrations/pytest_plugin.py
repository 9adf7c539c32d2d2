"""memdoc's pytest plugin: a test marked `@pytest.mark.memdoc(peak="1.5 GiB")` fails when
it needs more memory than its budget, with memdoc's diagnosis of why.

    @pytest.mark.memdoc(peak="512 MiB", growth_per_step="0 B", warmup=2)
    def test_training_does_not_leak(): ...

    pytest --memdoc                      # judge the marked tests
    pytest --memdoc --memdoc-dir traces  # and keep each one's trace and baseline figures

pytest loads the entry point `pytest_memdoc` (a module outside this package, which adds the
options and the marker) in every run wherever memdoc is installed; it registers this module
only when `--memdoc` is given, so that memdoc is imported only then.

A marked test runs inside `memdoc.watch`; its budget is kept on the place it ran: the GPU
whose framework allocated most (allocated bytes for `peak`, reserved for `peak_held`,
compared exactly), else the host (the process tree's own memory for `peak`, RSS for
`peak_held`, sampled, with a tolerance). `peak` is what the test added over what the process
held when it began, so earlier tests' memory does not count against it. memdoc's own
failures (a trace it cannot write) are warnings: they never fail a test, and an exception
the test raises passes through unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

    from memdoc.budget.testing import Limits, Verdict

MARKER = "memdoc"
# How often a marked test's memory is sampled (the host has no interval peaks: a spike
# shorter than this may go unseen there). 10 ms keeps a test's steps apart on a CPU.
INTERVAL_S = 0.01
# The user property a budgeted test's figures travel in, to the summary (from an xdist
# worker too) and to JUnit XML.
PROPERTY = "memdoc"
MAX_NAME_CHARS = 120


class MemdocWarning(pytest.PytestWarning):
    """memdoc could not measure a test (the test itself ran as usual)."""


@dataclass
class _State:
    """One pytest process's budgets: where traces go, and the rows of the summary."""

    keep: Path | None
    folder: Path | None = None

    def trace_folder(self) -> Path:
        if self.keep is not None:
            self.keep.mkdir(parents=True, exist_ok=True)
            return self.keep
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="memdoc-pytest-"))
        return self.folder

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


_STATE = pytest.StashKey[_State]()


def pytest_configure(config: pytest.Config) -> None:
    """Called once `pytest_memdoc` registers this module, which it does under --memdoc."""
    if config.getoption("memdoc", False):
        keep = config.getoption("memdoc_dir", None)
        config.stash[_STATE] = _State(Path(keep).absolute() if keep else None)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    state = item.config.stash.get(_STATE, None)
    marker = item.get_closest_marker(MARKER)
    if state is None or marker is None:
        return (yield)
    from memdoc.budget.testing import parse_limits

    bad: str | None = None
    try:
        limits = parse_limits(marker.args, marker.kwargs)
    except ValueError as exc:
        bad = str(exc)
    if bad is not None:  # raised outside the handler: one line, with no chained error
        pytest.fail(bad, pytrace=False)
    recording = _Recording.start(item, state, limits)
    try:
        result = yield
    except BaseException as exc:
        # The test's own failure (or skip) passes through as it was raised.
        if recording is not None:
            recording.stop(exc)
            recording.forget(state)
        raise
    if recording is None:
        return result
    recording.stop(None)
    verdict = recording.judge(item, limits)
    message = recording.conclude(item, state, verdict)
    if message is not None:
        pytest.fail(message, pytrace=False)
    return result


class _Recording:
    """One marked test's `memdoc.watch`, and what is done with its trace afterwards."""

    def __init__(self, watch: Any, path: Path, keep: bool) -> None:
        self.watch = watch
        self.path = path
        self.keep = keep
        self.trace: Any = None

    @classmethod
    def start(cls, item: pytest.Item, state: _State, limits: Limits) -> _Recording | None:
        """A watch on the test, or None (with a warning) where memdoc cannot record it."""
        try:
            from memdoc.api import watch
            from memdoc.budget.testing import return_freed_heap

            return_freed_heap()
            path = state.trace_folder() / (safe_name(item.nodeid) + ".memdoc")
            recorder = watch(path, quiet=True, force=True, interval=INTERVAL_S)
            recorder.__enter__()
        except Exception as exc:
            _warn(item, f"memdoc cannot record {item.nodeid}: {_reason(exc)}")
            return None
        session = recorder.session
        if session is None:  # the trace could not be opened: memdoc said why on stderr
            _warn(item, f"memdoc cannot record {item.nodeid} to {path}; the test ran unmeasured")
            return None
        # Growth is judged from the memory the process owns at each step boundary: with the
        # heap's freed pages returned first, that is what the test holds, not what the C
        # allocator kept of its temporaries (up to 19 MiB over 27 steps of a JAX loop that
        # keeps nothing; see HOST_GROWTH_NOISE_BYTES).
        session.trim_heap_at_steps = limits.growth_per_step is not None
        # The first sample now, not an interval later: what the process held when the test
        # began is what the test's peak is measured over.
        with contextlib.suppress(Exception):
            session.tick()
        return cls(recorder, path, keep=state.keep is not None)

    def stop(self, exc: BaseException | None) -> None:
        with contextlib.suppress(Exception):
            self.watch.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)

    def forget(self, state: _State) -> None:
        if not self.keep:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def judge(self, item: pytest.Item, limits: Limits) -> Verdict | None:
        try:
            from memdoc.budget.testing import judge, measure
            from memdoc.trace.reader import load_trace

            self.trace = load_trace(self.path)
            return judge(measure(self.trace, limits.warmup), limits)
        except Exception as exc:
            _warn(item, f"memdoc could not measure {item.nodeid}: {_reason(exc)}")
            return None

    def conclude(self, item: pytest.Item, state: _State, verdict: Verdict | None) -> str | None:
        """The failure message when over budget (else None); the test's summary row, its
        baseline figures when kept; the trace removed when not kept."""
        try:
            return self._conclude(item, state, verdict)
        except Exception as exc:
            _warn(item, f"memdoc could not judge {item.nodeid}: {_reason(exc)}")
            return None
        finally:
            self.forget(state)

    def _conclude(self, item: pytest.Item, state: _State, verdict: Verdict | None) -> str | None:
        from memdoc.budget.testing import failure_message, summary_row

        if verdict is None:
            return None
        item.user_properties.append((PROPERTY, summary_row(verdict)))
        findings: list[Any] = []
        if self.keep or not verdict.passed:
            findings = self._findings()
        if self.keep:
            self._save_baseline(item, findings, verdict)
        if verdict.passed:
            return None
        return failure_message(verdict, findings, str(self.path) if self.keep else None)

    def _findings(self) -> list[Any]:
        try:
            from memdoc.rules.engine import diagnose

            return list(diagnose(self.trace))
        except Exception:
            return []

    def _save_baseline(self, item: pytest.Item, findings: list[Any], verdict: Verdict) -> None:
        from memdoc.budget.figures import run_figures

        figures = run_figures(
            [self.trace], findings, ended="ok" if verdict.passed else "over budget"
        )
        target = self.path.with_name(self.path.name.removesuffix(".memdoc") + ".baseline.json")
        try:
            target.write_text(json.dumps(figures.to_dict(), indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            _warn(item, f"memdoc cannot write {target}: {exc.strerror or exc}")

    def __repr__(self) -> str:
        return f"<memdoc recording {self.path}>"


def safe_name(nodeid: str) -> str:
    """A file name for a test id: `tests/test_x.py::test_y[3]` -> `tests_test_x.py__test_y_3`;
    a long one is cut and told apart by a hash of the whole id."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("._") or "test"
    if len(name) > MAX_NAME_CHARS:
        digest = hashlib.sha1(nodeid.encode("utf-8", "replace")).hexdigest()[:10]
        name = f"{name[: MAX_NAME_CHARS - 11]}-{digest}"
    return name


def _warn(item: pytest.Item, text: str) -> None:
    """A warning in the test's report; never an error, even under `-W error`."""
    try:
        item.warn(MemdocWarning(text))
    except Exception:
        print(f"memdoc: warning: {text}", file=sys.stderr)


def _reason(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return message if isinstance(message, str) else f"{type(exc).__name__}: {exc}"


# -- the summary ---------------------------------------------------------------------------


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each budgeted test's row, from this process's tests or a pytest-xdist worker's."""
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == PROPERTY and isinstance(value, dict):
            _ROWS.append((report.nodeid, value))


# The summary's rows; pytest_runtest_logreport has no config to keep them in.
_ROWS: list[tuple[str, dict[str, Any]]] = []


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.stash.get(_STATE, None) is None or not _ROWS:
        return
    from memdoc.units import format_bytes

    def size(value: object) -> str:
        return format_bytes(value) if isinstance(value, int | float) else "-"

    table = [("test", "where", "peak", "peak held", "growth/step", "steps", "verdict")]
    for nodeid, figures in _ROWS:
        table.append(
            (
                nodeid,
                str(figures.get("where", "")),
                size(figures.get("peak")),
                size(figures.get("peak_held")),
                size(figures.get("growth_per_step")),
                str(figures.get("steps", "")),
                str(figures.get("verdict", "")),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    terminalreporter.write_sep("-", "memdoc budgets")
    for row in table:
        cells = [
            c.ljust(w) if i in (0, 1, 6) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        terminalreporter.write_line("  ".join(cells).rstrip())
    _ROWS.clear()
