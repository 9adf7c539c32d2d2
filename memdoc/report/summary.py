"""What memdoc prints when a watched program ends: a short diagnosis, or one quiet line."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from rich.text import Text

from memdoc.errors import MemdocError
from memdoc.forecast.summary import forecast_line
from memdoc.report.console import SafeConsole
from memdoc.report.data import OomView, oom_view
from memdoc.report.overview import Overview, build_overview
from memdoc.rules.base import Finding
from memdoc.rules.confidence import confidence_word
from memdoc.rules.engine import diagnose_run
from memdoc.trace import Trace, load_run
from memdoc.units import format_bytes, format_percent

# A finding at least this sure is worth a diagnosis even when the run ended well.
ALARM_CONFIDENCE = 0.5
SHOWN_FINDINGS = 3
SHOWN_MIN_CONFIDENCE = 0.25
FIX_LINES = 4


def print_end_of_run(
    paths: Sequence[str | os.PathLike[str]],
    stream: TextIO,
    *,
    report_path: str | os.PathLike[str] | None = None,
) -> None:
    """Diagnose the run's traces and print the outcome to `stream` (usually stderr)."""
    console = SafeConsole(file=stream, soft_wrap=True)
    try:
        run = load_run(paths)
    except MemdocError as exc:
        console.print(Text(f"memdoc: trace {_names(paths)} cannot be read: {exc.message}"))
        return
    findings = diagnose_run(run)
    overview = build_overview(run.primary)
    oom = oom_view(run.primary)
    if went_wrong(overview, oom, findings):
        first = headline(run.primary, overview, oom)
        for line in diagnosis_lines(first, oom, findings, paths, report_path):
            console.print(line)
    else:
        console.print(Text(quiet_line(overview, paths, report_path)))
    if (words := forecast_line(run.primary, ended_by_oom=oom is not None)) is not None:
        console.print(Text(f"  {words}", style="yellow"))


def went_wrong(overview: Overview, oom: OomView | None, findings: Sequence[Finding]) -> bool:
    """An OOM, a kill, a non-zero exit, or a finding we are fairly sure of."""
    return (
        oom is not None
        or overview.ending.bad
        or any(f.confidence >= ALARM_CONFIDENCE for f in findings)
    )


def headline(trace: Trace, overview: Overview, oom: OomView | None) -> Text:
    """How the run ended, in red when badly: which rank ran out, and of what memory; for a
    run that exited 0, that the OOMs it recorded were caught and survived."""
    ending = overview.ending
    style = "bold red" if ending.bad else "bold yellow"
    text = ending.text if ending.bad or oom is not None else "finished, but memory looks wrong"
    return Text(text, style=style)


def quiet_line(
    overview: Overview,
    paths: Sequence[str | os.PathLike[str]],
    report_path: str | os.PathLike[str] | None,
) -> str:
    """`memdoc: peak GPU 0 13.9 GiB, host 2.1 GiB · trace run.memdoc`."""
    peaks = [
        f"GPU {g.index} {format_bytes(g.peak_held_bytes)}"
        for g in overview.gpus
        if g.peak_held_bytes
    ]
    if overview.host_peak_rss_bytes:
        peaks.append(f"host {format_bytes(overview.host_peak_rss_bytes)}")
    line = "memdoc: " + (f"peak {', '.join(peaks)} · " if peaks else "")
    line += f"trace {_names(paths)}"
    if report_path is not None:
        line += f" · report {report_path}"
    return line


def diagnosis_lines(
    first: Text,
    oom: OomView | None,
    findings: Sequence[Finding],
    paths: Sequence[str | os.PathLike[str]],
    report_path: str | os.PathLike[str] | None,
) -> list[Text]:
    """The ending, what it means, the top findings with their first fix, and where to look."""
    lines = [Text.assemble(("memdoc: ", "bold"), first)]
    if oom is not None:
        lines.append(Text("  " + oom.words))
    shown = [f for f in findings if f.confidence >= SHOWN_MIN_CONFIDENCE][:SHOWN_FINDINGS]
    for number, finding in enumerate(shown, 1):
        lines += _finding_lines(number, finding)
    if not shown and findings:
        # Said, not hidden: diagnose lists these and exits 3 for them.
        names = ", ".join(f.rule for f in findings[:SHOWN_FINDINGS])
        lines.append(Text(f"  only weak signs of a memory problem: {names}", style="dim"))
    elif not shown:
        lines.append(Text("  no known memory pattern matched this run", style="dim"))
    lines += _where_lines(paths, report_path)
    return lines


def _finding_lines(number: int, finding: Finding) -> list[Text]:
    word = confidence_word(finding.confidence)
    lines = [
        Text.assemble(
            (f"  {number}. ", "bold"),
            (finding.title, "bold"),
            (f" ({word}, {format_percent(finding.confidence)})", "dim"),
        ),
        Text(f"     {finding.summary}"),
    ]
    if finding.fixes:
        fix = finding.fixes[0]
        lines.append(Text.assemble(("     fix: ", "green"), (fix.title, "")))
        code = fix.code.strip().splitlines()
        lines += [Text(f"       {line}", style="cyan") for line in code[:FIX_LINES]]
        if len(code) > FIX_LINES:
            lines.append(Text("       …", style="cyan"))
    return lines


def _where_lines(
    paths: Sequence[str | os.PathLike[str]], report_path: str | os.PathLike[str] | None
) -> list[Text]:
    lines = [Text.assemble(("  trace:  ", "dim"), (_names(paths), ""))]
    if report_path is not None:
        lines.append(Text.assemble(("  report: ", "dim"), (str(report_path), "")))
    args = " ".join(shlex.quote(str(p)) for p in paths)
    more = f"memdoc diagnose {args}"
    if report_path is None:
        more += f"   ·   memdoc report {args}"
    lines.append(Text.assemble(("  more:   ", "dim"), (more, "")))
    return lines


def _names(paths: Sequence[str | os.PathLike[str]]) -> str:
    first = str(Path(paths[0])) if paths else "-"
    return first if len(paths) <= 1 else f"{first} (+{len(paths) - 1} more)"
