"""Where a scrape's state comes from: the trace file a run writes, or an in-memory trace."""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from memdoc.errors import MemdocError
from memdoc.metrics.snapshot import MetricsSnapshot, snapshot_of
from memdoc.rules.base import Finding
from memdoc.rules.engine import diagnose
from memdoc.trace.reader import Trace
from memdoc.trace.tail import TraceTail

# The catalogue runs at most this often: a scrape every 15 s then costs one diagnosis per
# scrape at most, and a faster scraper does not multiply it.
RULES_INTERVAL_S = 10.0
# How long one scrape may spend catching up with a trace (the first scrape of a long run).
CATCH_UP_BUDGET_S = 2.0
# What the exporter keeps of each series: the parent's memory stays bounded in a long run
# (8 GPUs, 64 processes at 0.1 s is about 4 MB a minute of values). The top finding is the
# catalogue's verdict on this stretch; `memdoc diagnose` reads the whole trace.
HISTORY_S = 600.0

Diagnose = Callable[[Trace], Sequence[Finding]]


class _RulesCache:
    """The catalogue's findings on a trace, recomputed at most every `interval_s`."""

    def __init__(self, diagnose_fn: Diagnose, interval_s: float) -> None:
        self._diagnose = diagnose_fn
        self._interval_s = interval_s
        self._at = float("-inf")
        self._findings: Sequence[Finding] = ()

    def due(self, *, final: bool) -> bool:
        """Whether `findings` would diagnose again now."""
        return time.monotonic() - self._at >= self._interval_s or (
            final and self._at < float("inf")
        )

    def findings(self, trace: Trace, *, final: bool) -> Sequence[Finding]:
        if self.due(final=final):
            self._findings = self._diagnose(trace)
            # A finished run is diagnosed once.
            self._at = float("inf") if final else time.monotonic()
        return self._findings


class TraceFileSource:
    """The state of `memdoc run` read from the trace it writes, only when scraped.

    The run's writer is never touched: the scrape reads the lines appended since the last
    scrape (as `memdoc live` does), so a slow scraper cannot hold up the sampler.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        diagnose_fn: Diagnose = diagnose,
        rules_interval_s: float = RULES_INTERVAL_S,
        history_s: float = HISTORY_S,
    ) -> None:
        self._tail = TraceTail(path)
        self._history_s = history_s
        self._lock = threading.Lock()
        self._rules = _RulesCache(diagnose_fn, rules_interval_s)
        self.error: str | None = None

    def snapshot(self) -> MetricsSnapshot | None:
        with self._lock:
            deadline = time.monotonic() + CATCH_UP_BUDGET_S
            try:
                self._tail.poll()
                while not self._tail.caught_up and time.monotonic() < deadline:
                    self._tail.poll()
            except MemdocError as exc:
                self.error = exc.message
                return None
            trace = self._tail.trace
            if trace is None:
                return None
            forget_before(trace, trace.last_t - self._history_s)
            findings = self._rules.findings(trace, final=trace.complete)
            return snapshot_of(trace, findings)


class SharedTraceSource:
    """The state of an in-memory trace that another thread fills (`memdoc top`): read under
    the lock that thread holds while it adds values."""

    def __init__(
        self,
        trace: Callable[[], Trace | None],
        lock: AbstractContextManager[object],
        *,
        diagnose_fn: Diagnose = diagnose,
        rules_interval_s: float = RULES_INTERVAL_S,
    ) -> None:
        self._trace = trace
        self._lock = lock
        self._rules = _RulesCache(diagnose_fn, rules_interval_s)

    def snapshot(self) -> MetricsSnapshot | None:
        with self._lock:
            trace = self._trace()
            if trace is None:
                return None
            if not self._rules.due(final=False):
                return snapshot_of(trace, self._rules.findings(trace, final=False))
            # The catalogue reads a copy, so that the sampler is not held up while it runs.
            trace = trace.copy()
        return snapshot_of(trace, self._rules.findings(trace, final=False))


def forget_before(trace: Trace, t: float) -> None:
    """Drop every series value recorded before `t` (events and processes are kept)."""
    for key in trace.series_keys():
        series = trace.series(key.metric, key.device, key.pid)
        if series is None or not series.times or series.times[0] >= t:
            continue
        cut = bisect.bisect_left(series.times, t)
        cut = min(cut, len(series.times) - 1)  # the last value stays: it is still "now"
        del series.times[:cut]
        del series.values[:cut]
