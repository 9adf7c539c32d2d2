"""The terminal report (`memdoc diagnose`): rich tables of the same data the HTML report draws."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from memdoc.report.allocations import Allocations
from memdoc.report.data import NO_PROBLEM, RankRow, ReportData
from memdoc.report.overview import Overview, steps_words
from memdoc.report.timeline import StepTable
from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import confidence_line, confidence_word
from memdoc.rules.facts import framework_name
from memdoc.trace.ledger import Ledger
from memdoc.units import format_bytes, format_duration, format_percent

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 20


def render_terminal(data: ReportData, console: Console) -> None:
    """Print the report: what happened, findings, ledger, per step, allocations, ranks."""
    console.print(what_happened(data))
    console.print(findings_view(data.findings, data.none_found))
    for part in (
        ledger_view(data.ledgers),
        steps_view(data.steps),
        allocations_view(data.allocations),
        ranks_view(data.ranks),
    ):
        if part is not None:
            console.print(part)
    for warning in data.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"))
    target = data.overview.trace_path or "TRACE"
    console.print(
        Text(
            f"The timeline of every layer is in the HTML report: memdoc report {target}",
            style="dim",
        )
    )


def _heading(title: str) -> Text:
    return Text(f"\n{title}", style="bold underline")


def what_happened(data: ReportData) -> RenderableType:
    ov = data.overview
    ending = ov.ending
    lines: list[RenderableType] = [
        Text(ending.text, style="bold red" if ending.bad else "bold green")
    ]
    if data.oom is not None:
        lines.append(Text(data.oom.words))
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim")
    facts.add_column()
    for label, value in _facts(ov):
        facts.add_row(label, Text(value))
    lines += [Text(""), facts]
    if ov.gpus:
        lines += [Text(""), _gpu_table(ov)]
    else:
        lines.append(Text("No GPU was recorded: host memory only.", style="dim"))
    for name, reason, hint in ov.unavailable:
        note = Text.assemble(("not recorded: ", "yellow"), (f"{name}: {reason}", ""))
        if hint:
            note.append(f" ({hint})", style="dim")
        lines.append(note)
    title = Text(f"memdoc · {data.title}", style="bold")
    return Panel(
        Group(*lines),
        title=title,
        title_align="left",
        border_style="red" if ending.bad else "green",
    )


def _facts(ov: Overview) -> list[tuple[str, str]]:
    frameworks = ", ".join(
        f"{framework_name(n)} {v}" if v else framework_name(n) for n, v in ov.frameworks
    )
    facts = [
        ("command", ov.command),
        ("host", ov.host or ""),
        ("rank", f"{ov.rank} of {ov.world_size}" if ov.rank is not None else ""),
        ("duration", format_duration(ov.duration_s) if ov.duration_s else ""),
        ("frameworks", frameworks or "none seen"),
        ("steps", steps_words(ov)),
        ("host peak RSS", _host_peak(ov)),
        ("trace", ov.trace_path or ""),
    ]
    return [(k, v) for k, v in facts if v]


def _host_peak(ov: Overview) -> str:
    """ "1.2 GiB of the 8.0 GiB cgroup limit": the run's peak against what bounds it."""
    if not ov.host_peak_rss_bytes:
        return ""
    peak = format_bytes(ov.host_peak_rss_bytes)
    if ov.host_limit_bytes:
        peak += f" of the {format_bytes(ov.host_limit_bytes)} {ov.host_limit_name}"
    return peak


def _gpu_table(ov: Overview) -> Table:
    table = Table(box=None, header_style="dim", pad_edge=False)
    for name, justify in (
        ("device", "left"),
        ("name", "left"),
        ("total", "right"),
        ("peak held", "right"),
        ("peak used (all)", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for g in ov.gpus:
        table.add_row(
            f"GPU {g.index}",
            Text(g.name),
            format_bytes(g.total_bytes),
            Text(format_bytes(g.peak_held_bytes), style="bold"),
            format_bytes(g.peak_used_bytes),
        )
    return table


# -- findings -----------------------------------------------------------------------------


def findings_view(
    found: Sequence[Finding], none_found: Sequence[str] = (NO_PROBLEM,)
) -> RenderableType:
    if not found:
        verdict, *more = none_found
        style = "green" if verdict == NO_PROBLEM else "yellow"
        return Group(_heading("Why"), Text(verdict, style=style), *(Text(line) for line in more))
    return Group(
        _heading("Why, and what to change"), *[_finding(i + 1, f) for i, f in enumerate(found)]
    )


def _finding(number: int, f: Finding) -> RenderableType:
    word = confidence_word(f.confidence)
    style = {"strong": "bold red", "likely": "bold yellow"}.get(word, "bold")
    title = Text.assemble(
        (f"{number}. ", "bold"),
        (f.title, style),
        (f"  {word} · {format_percent(f.confidence)}", "dim"),
        (f"  {f.code} {f.rule}", "dim"),
    )
    if f.rank is not None:
        title.append(f"  rank {f.rank}", style="dim")
    parts: list[RenderableType] = [title, Padding(Text(f.summary), (0, 0, 0, 3))]
    parts += [Padding(Text(f"• {e.text}"), (0, 0, 0, 3)) for e in f.evidence]
    if f.reasons:
        because = Text(confidence_line(f.reasons), style="dim")
        parts.append(Padding(because, (0, 0, 0, 3)))
    if f.to_confirm:
        parts.append(Padding(Text(f"to confirm: {f.to_confirm}", style="italic dim"), (0, 0, 0, 3)))
    if f.fixes:
        parts.append(Padding(fix_view(f.fixes[0]), (0, 0, 0, 3)))
        others = "; ".join(fix.title for fix in f.fixes[1:])
        if others:
            parts.append(Padding(Text(f"also: {others}", style="dim"), (0, 0, 0, 3)))
    return Group(*parts, Text(""))


def fix_view(fix: Fix) -> RenderableType:
    who = framework_name(fix.framework) if fix.framework != "any" else "any framework"
    head = Text.assemble(("fix: ", "bold green"), (fix.title, "bold"), (f"  ({who})", "dim"))
    language = getattr(fix, "language", "python")
    code = Syntax(
        fix.code.strip(), language, theme="ansi_dark", background_color="default", word_wrap=True
    )
    return Group(head, Padding(code, (0, 0, 0, 2)))


# -- ledger, steps, allocations, ranks ----------------------------------------------------


def ledger_view(ledgers: Sequence[Ledger]) -> RenderableType | None:
    if not ledgers:
        return None
    parts: list[RenderableType] = [_heading("Where the memory went")]
    for device in dict.fromkeys(lg.device for lg in ledgers):
        moments = [lg for lg in ledgers if lg.device == device]
        parts.append(_ledger_table(device, moments))
        for lg in moments:
            when = "at the OOM" if lg.moment == "oom" else "at peak"
            if lg.unknown:
                parts.append(
                    Text(
                        f"{when}: not measured (in the remainder): {', '.join(lg.unknown_labels)}",
                        style="dim",
                    )
                )
            parts += [Text(f"{when}: {note}", style="dim") for note in lg.notes]
    return Group(*parts)


def _ledger_table(device: int, moments: Sequence[Ledger]) -> Table:
    table = Table(title=f"GPU {device}", title_justify="left", box=None, header_style="dim")
    table.add_column("term")
    for lg in moments:
        when = "at the OOM" if lg.moment == "oom" else "at peak"
        at = f" ({lg.t:.1f} s)" if lg.t is not None else ""
        table.add_column(when + at, justify="right")
        table.add_column("share", justify="right")
    for label in dict.fromkeys(t.label for lg in moments for t in lg.terms):
        cells: list[str] = []
        for lg in moments:
            found = [t.bytes for t in lg.terms if t.label == label]
            amount = sum(found) if found else None
            share = amount / lg.total_bytes if amount is not None and lg.total_bytes else None
            cells += [format_bytes(amount, 2), format_percent(share)]
        table.add_row(Text(label), *cells)
    totals: list[str] = []
    for lg in moments:
        totals += [format_bytes(lg.total_bytes, 2), ""]
    table.add_row(Text("device total", style="bold"), *totals, end_section=True)
    return table


def sparkline(values: Sequence[float], width: int = SPARK_WIDTH) -> str:
    """Block characters for a curve, squeezed to `width` by keeping each chunk's maximum."""
    if not values:
        return ""
    chunk = max(1, -(-len(values) // width))
    points = [max(values[i : i + chunk]) for i in range(0, len(values), chunk)]
    lo, hi = min(points), max(points)
    span = hi - lo or 1.0
    return "".join(SPARK[round((v - lo) / span * (len(SPARK) - 1))] for v in points)


def steps_view(tables: Sequence[StepTable]) -> RenderableType | None:
    if not tables:
        return None
    table = Table(box=None, header_style="dim")
    table.add_column("curve", min_width=18)
    for name in ("steps", "last baseline", "trend", "highest peak"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("shape", no_wrap=True, overflow="crop")
    for t in tables:
        baselines = [r.baseline for r in t.rows if r.baseline is not None]
        peaks = [r.peak for r in t.rows if r.peak is not None]
        table.add_row(
            Text(t.title),
            str(len(t.rows)),
            format_bytes(baselines[-1] if baselines else None),
            _trend(t.growth_bytes_per_step),
            format_bytes(max(peaks) if peaks else None),
            Text(sparkline(baselines), style="cyan"),
        )
    return Group(_heading("Per step"), table)


def _trend(bytes_per_step: float | None) -> str:
    if bytes_per_step is None:
        return "-"
    sign = "+" if bytes_per_step >= 0 else "-"
    return f"{sign}{format_bytes(abs(bytes_per_step))}/step"


def allocations_view(allocs: Allocations | None) -> RenderableType | None:
    if allocs is None:
        return None
    table = Table(box=None, header_style="dim")
    table.add_column("where (first frame of your code)")
    table.add_column("live bytes", justify="right")
    table.add_column("share", justify="right")
    table.add_column("blocks", justify="right")
    for site in allocs.sites:
        table.add_row(
            Text(site.site),
            format_bytes(site.bytes, 2),
            format_percent(site.share),
            str(site.count),
        )
    if allocs.other_bytes:
        table.add_row("elsewhere", format_bytes(allocs.other_bytes, 2), "", "")
    pool = allocs.fragmentation
    facts = Text(
        f"pool: {format_bytes(pool.reserved_bytes)} reserved, {format_bytes(pool.allocated_bytes)} "
        f"allocated, largest free block {format_bytes(pool.largest_free_block_bytes)}, "
        f"fragmentation {format_percent(pool.ratio)} (1 - largest free block / free)",
        style="dim",
    )
    title = _heading(f"Allocations on GPU {allocs.device} (snapshot {allocs.snapshot})")
    what_if = [Text(f"what if {w.change}: {w.verdict}") for w in allocs.what_if]
    return Group(title, table, facts, *what_if)


def ranks_view(rows: Sequence[RankRow]) -> RenderableType | None:
    if not rows:
        return None
    table = Table(box=None, header_style="dim")
    for name in ("trace", "host", "peak held", "how it ended", "started"):
        table.add_column(name)
    for r in rows:
        label = Text(r.label)
        if r.failed_first:
            label.append("  failed first", style="bold red")
        table.add_row(
            label,
            Text(r.host or "-"),
            format_bytes(r.peak_held_bytes),
            Text(r.ending.text, style="red" if r.ending.bad else ""),
            f"+{r.offset_s:.1f} s",
        )
    return Group(_heading("Ranks"), table)
