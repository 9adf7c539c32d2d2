"""Everything a report shows, computed once from a run: `ReportData.from_run(run, findings)`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memdoc.report.allocations import Allocations, load_allocations
from memdoc.report.downsample import DEFAULT_MAX_POINTS, minmax_downsample
from memdoc.report.ledger import device_ledgers, held_series
from memdoc.report.overview import (
    Ending,
    Overview,
    build_overview,
    ending_of,
    peak_held_bytes,
)
from memdoc.report.timeline import Line, StepTable, Timeline, build_timeline, step_tables
from memdoc.rules.base import Finding
from memdoc.rules.engine import explain_in_words, sort_findings
from memdoc.trace import EventKind, OomInfo, Run, Trace
from memdoc.trace.ledger import Ledger
from memdoc.trace.reader import oom_of
from memdoc.units import format_bytes, format_percent
from memdoc.version import __version__

RANK_MAX_POINTS = 1000
NO_PROBLEM = "No memory problem found in this run."
# Holders named when a snapshot cannot say whether the run failed.
QUIET_HOLDERS = 3


@dataclass(frozen=True)
class OomView:
    """The memory error that ended the run, with its explanation in words."""

    info: OomInfo
    t: float | None
    words: str
    rank: int | None
    stack: tuple[str, ...]
    handled: bool


@dataclass(frozen=True)
class RankRow:
    """One trace of a multi-rank run, placed on a wall-clock axis shared by all ranks."""

    label: str
    rank: int | None
    host: str | None
    trace_path: str | None
    ending: Ending
    failed_first: bool
    peak_held_bytes: int | None
    peak_device: int | None
    offset_s: float  # how long after the earliest trace this one started
    line: Line | None  # memory held on `peak_device`, times shifted by `offset_s`


@dataclass(frozen=True)
class ReportData:
    """The computed report: the HTML and the terminal render this, and only this."""

    title: str
    overview: Overview
    findings: tuple[Finding, ...]
    oom: OomView | None
    ledgers: tuple[Ledger, ...]
    timeline: Timeline
    steps: tuple[StepTable, ...]
    allocations: Allocations | None
    ranks: tuple[RankRow, ...]
    warnings: tuple[str, ...]
    memdoc_version: str
    # What "Why" says when nothing was found: lines, the first one the verdict.
    none_found: tuple[str, ...] = (NO_PROBLEM,)

    @classmethod
    def from_run(
        cls,
        run: Run,
        findings: list[Finding],
        *,
        max_points: int = DEFAULT_MAX_POINTS,
        title: str | None = None,
    ) -> ReportData:
        """Compute the report of the trace that failed first (else the first), and the ranks.

        `title` names the report (default: the trace's file name).
        """
        trace = run.primary
        # A rule that failed is named beside the run's own warnings (see rules.engine.Findings).
        warnings = [*run.warnings, *getattr(findings, "warnings", ()), *loss_warnings(run)]
        oom = oom_view(trace)
        allocations = load_allocations(trace, warnings)
        return cls(
            title=title or _title(trace),
            overview=build_overview(trace),
            findings=tuple(sort_findings(findings)),
            oom=oom,
            ledgers=tuple(device_ledgers(trace, oom.info if oom else None, oom.t if oom else None)),
            timeline=build_timeline(trace, max_points),
            steps=tuple(step_tables(trace)),
            allocations=allocations,
            ranks=tuple(rank_rows(run)) if len(run.traces) > 1 else (),
            warnings=tuple(warnings),
            memdoc_version=__version__,
            none_found=none_found(trace, allocations),
        )


def none_found(trace: Trace, allocations: Allocations | None) -> tuple[str, ...]:
    """What to say when no rule found anything. A run that was watched to its end had no
    memory problem memdoc could see; an imported snapshot that holds no out-of-memory record
    cannot tell either way, so it says so, and where the memory was."""
    if not _snapshot_without_oom(trace):
        return (NO_PROBLEM,)
    lines = [
        "The snapshot holds no out-of-memory record: memdoc cannot tell from it whether this "
        "run ran out of memory."
    ]
    if allocations is not None and allocations.sites:
        lines.append(
            f"Where the memory was on GPU {allocations.device} "
            f"({format_bytes(allocations.live_bytes)} live), largest first:"
        )
        lines += [
            f"  {format_bytes(site.bytes)} ({format_percent(site.share)}) {site.site}"
            for site in allocations.sites[:QUIET_HOLDERS]
        ]
    return tuple(lines)


def _snapshot_without_oom(trace: Trace) -> bool:
    snapshots = trace.events(EventKind.SNAPSHOT)
    imported = trace.header.mode == "import"
    return imported and bool(snapshots) and not trace.oom_events()


def loss_warnings(run: Run) -> list[str]:
    """What agents dropped while memdoc could not keep up, one line per gap."""
    return [
        f"{loss.samples} samples/{loss.events} events from PID {loss.pid} were lost between "
        f"{loss.start_s:.1f} s and {loss.end_s:.1f} s while memdoc could not keep up"
        for trace in run.traces
        for loss in trace.losses()
    ]


def _title(trace: Trace) -> str:
    if trace.path is not None:
        return Path(trace.path).name
    return trace.header.command[0] if trace.header.command else "memdoc run"


def oom_view(trace: Trace) -> OomView | None:
    event = trace.ending_oom_event()
    info = oom_of(event) if event is not None else None
    if event is None or info is None:
        return None
    stack = event.data.get("stack")
    return OomView(
        info=info,
        t=None if trace.is_text_only else event.t,
        words=explain_in_words(info),
        rank=trace.rank,
        stack=tuple(str(f) for f in stack) if isinstance(stack, list) else (),
        # Caught once and then let out (a loop that catches, cleans up and re-raises) is
        # not survived: the run that failed ended with it.
        handled=bool(event.data.get("handled")) and not _run_failed(trace),
    )


def _run_failed(trace: Trace) -> bool:
    return trace.exit is not None and trace.exit.status not in (0, None)


def rank_rows(run: Run) -> list[RankRow]:
    """One row per trace, the one that failed first marked."""
    first = run.failed_first()
    start = min(t.header.created_unix for t in run.traces)
    rows: list[RankRow] = []
    for i, trace in enumerate(run.traces):
        peaks = {d.index: peak_held_bytes(trace, d.index) for d in trace.devices() if d.index >= 0}
        known = {d: b for d, b in peaks.items() if b is not None}
        device = max(known, key=known.__getitem__) if known else None
        offset = trace.header.created_unix - start
        rows.append(
            RankRow(
                label=_label(trace, i),
                rank=trace.rank,
                host=trace.header.host,
                trace_path=str(trace.path) if trace.path is not None else None,
                ending=ending_of(trace),
                failed_first=trace is first,
                peak_held_bytes=known.get(device) if device is not None else None,
                peak_device=device,
                offset_s=offset,
                line=_rank_line(trace, device, offset),
            )
        )
    return rows


def _label(trace: Trace, index: int) -> str:
    """A rank's own trace by its rank, a node's (all its ranks) by its node rank."""
    if trace.rank is not None:
        return f"rank {trace.rank}"
    if trace.header.node_rank is not None:
        return f"node {trace.header.node_rank}"
    return f"trace {index + 1}"


def _rank_line(trace: Trace, device: int | None, offset_s: float) -> Line | None:
    series = held_series(trace, device) if device is not None else None
    if series is None or not series.values:
        return None
    times, values = minmax_downsample(series.times, series.values, RANK_MAX_POINTS)
    shifted = tuple(round(t + offset_s, 3) for t in times)
    return Line(f"GPU {device}", "reserved", shifted, tuple(values), len(series))
