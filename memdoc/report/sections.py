"""The HTML of each report section; every string taken from a trace goes through `esc`."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence

from memdoc.report.allocations import Allocations
from memdoc.report.data import NO_PROBLEM, OomView, RankRow, ReportData
from memdoc.report.figures import TERM_COLORS
from memdoc.report.overview import Overview, steps_words
from memdoc.report.timeline import StepTable, Timeline
from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import confidence_line, confidence_word
from memdoc.rules.facts import framework_name
from memdoc.trace.ledger import Ledger
from memdoc.units import format_bytes, format_duration, format_percent

MAX_STEP_ROWS = 12  # rows of the per-step table; the figure shows them all


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _section(anchor: str, title: str, body: str, lead: str = "") -> str:
    intro = f'<p class="lead">{lead}</p>' if lead else ""
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{intro}{body}</section>'


def _figure(fig_id: str, present: bool) -> str:
    return f'<div class="plot" id="{fig_id}"></div>' if present else ""


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table; cells are HTML already (the caller escapes what comes from a trace)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


# -- the top bar and "what happened" ------------------------------------------------------


def top_bar(data: ReportData, nav: Sequence[tuple[str, str]]) -> str:
    ending = data.overview.ending
    badge = "bad" if ending.bad else "ok"
    links = "".join(f'<a href="#{anchor}">{esc(label)}</a>' for anchor, label in nav)
    return (
        '<header class="top"><div class="brand">memdoc</div>'
        f'<div class="run-title">{esc(data.title)}</div>'
        f'<span class="badge {badge}">{esc(ending.kind.replace("-", " "))}</span>'
        f"<nav>{links}</nav></header>"
    )


def what_happened(data: ReportData) -> str:
    ov = data.overview
    parts = [_ending_panel(ov, data.oom), _facts(ov), _gpu_table(ov), _collector_notes(ov)]
    return _section("what", "What happened", "".join(parts))


def _ending_panel(ov: Overview, oom: OomView | None) -> str:
    ending = ov.ending
    cls = "ending bad" if ending.bad else "ending ok"
    shown_at = ending.t is not None and ending.kind in ("oom", "host-oom")
    at = f' <span class="muted">at {ending.t:.1f} s</span>' if shown_at else ""
    body = f'<div class="ending-title">{esc(ending.text)}{at}</div>'
    if oom is not None:
        body += f'<p class="words">{esc(oom.words)}</p>'
        if oom.info.message:
            body += (
                "<details><summary>The error message</summary>"
                f'<pre class="message">{esc(oom.info.message)}</pre></details>'
            )
        if oom.stack:
            frames = "\n".join(oom.stack[-12:])
            body += f"<details><summary>Where it failed</summary><pre>{esc(frames)}</pre></details>"
    return f'<div class="{cls}">{body}</div>'


def _facts(ov: Overview) -> str:
    frameworks = ", ".join(
        f"{framework_name(name)} {version}" if version else framework_name(name)
        for name, version in ov.frameworks
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ov.started_unix))
    rank = f"{ov.rank} of {ov.world_size}" if ov.rank is not None else None
    host_peak = format_bytes(ov.host_peak_rss_bytes) if ov.host_peak_rss_bytes else None
    if host_peak and ov.host_limit_bytes:
        host_peak += f" (of the {format_bytes(ov.host_limit_bytes)} {ov.host_limit_name})"
    items = [
        ("Command", f"<code>{esc(ov.command)}</code>" if ov.command else None),
        ("Host", esc(ov.host) if ov.host else None),
        ("Rank", esc(rank) if rank else None),
        ("Started", esc(started) if ov.started_unix else None),
        ("Duration", esc(format_duration(ov.duration_s)) if ov.duration_s else None),
        ("Frameworks", esc(frameworks) if frameworks else "none seen"),
        ("Python", esc(ov.python) if ov.python else None),
        ("Steps", steps_words(ov) or None),
        ("Host peak RSS", esc(host_peak) if host_peak else None),
        ("Memory settings", esc(" ".join(f"{k}={v}" for k, v in ov.env)) if ov.env else None),
        ("Trace", f"<code>{esc(ov.trace_path)}</code>" if ov.trace_path else None),
    ]
    rows = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items if v)
    return f'<dl class="facts">{rows}</dl>'


def _gpu_table(ov: Overview) -> str:
    if not ov.gpus:
        return '<p class="muted">No GPU was recorded: this report shows host memory only.</p>'
    rows = [
        (
            f"GPU {g.index}",
            esc(g.name),
            format_bytes(g.total_bytes),
            f"<strong>{format_bytes(g.peak_held_bytes)}</strong>",
            format_bytes(g.peak_used_bytes),
        )
        for g in ov.gpus
    ]
    head = ("Device", "Name", "Total", "Peak held by this run", "Peak used (all processes)")
    return _table(head, rows, "devices")


def _collector_notes(ov: Overview) -> str:
    if not ov.unavailable:
        return ""
    items = "".join(
        f"<li><strong>{esc(name)}</strong>: {esc(reason)}"
        + (f' <span class="muted">({esc(hint)})</span>' if hint else "")
        + "</li>"
        for name, reason, hint in ov.unavailable
    )
    return f'<div class="notes"><div class="notes-title">Not recorded</div><ul>{items}</ul></div>'


# -- findings -----------------------------------------------------------------------------


def findings(found: Sequence[Finding], none_found: Sequence[str] = (NO_PROBLEM,)) -> str:
    lead = "Best-supported causes first. Each names the numbers it rests on and what to change."
    if not found:
        verdict, *more = none_found
        body = f'<p class="none">{esc(verdict)}</p>'
        if more:
            body += "<pre>" + esc("\n".join(more)) + "</pre>"
        return _section("why", "Why, and what to change", body)
    return _section("why", "Why, and what to change", "".join(map(_finding, found)), lead)


def _finding(f: Finding) -> str:
    word = confidence_word(f.confidence)
    evidence = "".join(f"<li>{esc(e.text)}</li>" for e in f.evidence)
    fixes = "".join(_fix(fix, True) for fix in f.fixes[:1])
    if len(f.fixes) > 1:
        more = "".join(_fix(fix, False) for fix in f.fixes[1:])
        label = "1 more fix" if len(f.fixes) == 2 else f"{len(f.fixes) - 1} more fixes"
        fixes += f'<details class="more-fixes"><summary>{label}</summary>{more}</details>'

    rank = f' <span class="tag">rank {f.rank}</span>' if f.rank is not None else ""
    confirm = f'<p class="confirm">To confirm: {esc(f.to_confirm)}</p>' if f.to_confirm else ""
    because = f'<p class="because">{esc(confidence_line(f.reasons))}</p>' if f.reasons else ""
    return (
        f'<article class="finding conf-{word}">'
        f'<header><span class="code">{esc(f.code)}</span><h3>{esc(f.title)}</h3>{rank}'
        f'<span class="confidence" title="confidence {f.confidence:.2f}">'
        f'<span class="meter"><span style="width:{round(f.confidence * 100)}%"></span></span>'
        f"{esc(word)} · {format_percent(f.confidence)}</span></header>"
        f'<p class="summary">{esc(f.summary)}</p>'
        + (f'<ul class="evidence">{evidence}</ul>' if evidence else "")
        + because
        + confirm
        + (f'<div class="fixes">{fixes}</div>' if fixes else "")
        + f'<div class="slug">rule <code>{esc(f.rule)}</code></div></article>'
    )


def _fix(fix: Fix, first: bool) -> str:
    label = framework_name(fix.framework) if fix.framework != "any" else "any framework"
    language = esc(getattr(fix, "language", "python"))
    return (
        f'<div class="fix{" first" if first else ""}"><div class="fix-head">'
        f'<span class="tag">{esc(label)}</span><span class="fix-title">{esc(fix.title)}</span>'
        '<button type="button" class="copy">Copy</button></div>'
        f'<pre><code class="lang-{language}">{esc(fix.code.strip())}</code></pre></div>'
    )


# -- ledger, timeline, steps --------------------------------------------------------------


def ledger(ledgers: Sequence[Ledger], has_figure: bool) -> str:
    if not ledgers:
        return ""
    lead = (
        "Each bar is the whole device. Allocated is live tensors; cached but free is held by the "
        "framework's pool; context + other allocators is what the driver counts for this process "
        "beyond the pool; the remainder is what no reading explains."
    )
    devices = list(dict.fromkeys(lg.device for lg in ledgers))
    tables = "".join(_device_ledger([lg for lg in ledgers if lg.device == d]) for d in devices)
    body = _figure("fig-ledger", has_figure) + tables
    return _section("ledger", "Where the memory went", body, lead)


def _device_ledger(moments: Sequence[Ledger]) -> str:
    """One table per device: a row per term, a pair of columns (bytes, share) per moment."""
    labels = list(dict.fromkeys(term.label for lg in moments for term in lg.terms))
    keys = {term.label: term.key for lg in moments for term in lg.terms}
    head = ["Term"]
    for lg in moments:
        source = " (error message)" if lg.source == "oom message" else ""
        head += [esc(_moment_words(lg) + source), "Share"]
    rows = []
    for label in labels:
        color = TERM_COLORS.get(keys[label], "#9ca3af")
        row = [f'<span class="swatch" style="background:{color}"></span>{esc(label)}']
        for lg in moments:
            amount = sum(t.bytes for t in lg.terms if t.label == label)
            present = any(t.label == label for t in lg.terms)
            share = amount / lg.total_bytes if lg.total_bytes and present else None
            row += [format_bytes(amount, 2) if present else "-", format_percent(share)]
        rows.append(row)
    total_row = ["<strong>device total</strong>"]
    for lg in moments:
        total_row += [f"<strong>{format_bytes(lg.total_bytes, 2)}</strong>", ""]
    rows.append(total_row)
    notes: list[str] = []
    for lg in moments:
        prefix = f"{_moment_words(lg)}: "
        if lg.unknown:
            notes.append(
                prefix + f"not measured, so inside the remainder: {', '.join(lg.unknown_labels)}."
            )
        notes += [prefix + note for note in lg.notes]
    note_html = "".join(f'<p class="note">{esc(n)}</p>' for n in dict.fromkeys(notes))
    title = f"<h3>GPU {moments[0].device}</h3>"
    table = _table(head, rows, "ledger")
    return f'<div class="ledger-block">{title}{table}{note_html}</div>'


def _moment_words(lg: Ledger) -> str:
    when = "at the OOM" if lg.moment == "oom" else "at peak"
    return f"{when}, {lg.t:.1f} s" if lg.t is not None else when


def timeline(tl: Timeline, has_figure: bool) -> str:
    if not has_figure:
        return ""
    lead = "Every layer over time. Drag to zoom, use the slider below, double-click to reset."
    if tl.step_stride > 1:
        lead += f" One step boundary in {tl.step_stride} is drawn."
    return _section("timeline", "Timeline", _figure("fig-timeline", True), lead)


def steps(tables: Sequence[StepTable], has_figure: bool) -> str:
    if not tables:
        return ""
    body = _figure("fig-steps", has_figure) + "".join(_step_table(t) for t in tables)
    lead = "Baseline after each step and peak inside it: a leak reads as a slope."
    return _section("steps", "Per step", body, lead)


def _step_table(table: StepTable) -> str:
    growth = ""
    if table.growth_bytes_per_step is not None:
        sign = "+" if table.growth_bytes_per_step >= 0 else "-"
        per_step = format_bytes(abs(table.growth_bytes_per_step), 2)
        growth = f'<p class="note">Baseline trend after step 1: {sign}{per_step} per step.</p>'
    rows = list(table.rows)
    shown = (
        rows
        if len(rows) <= MAX_STEP_ROWS
        else rows[: MAX_STEP_ROWS // 2] + rows[-MAX_STEP_ROWS // 2 :]
    )
    cells = [(str(r.step), format_bytes(r.baseline, 2), format_bytes(r.peak, 2)) for r in shown]
    if len(rows) > len(shown):
        cells.insert(MAX_STEP_ROWS // 2, ("…", f"{len(rows) - len(shown)} more steps", ""))
    return (
        f'<details class="step-table"><summary>{esc(table.title)}: table</summary>'
        + _table(("Step", "Baseline", "Peak"), cells, "steps")
        + "</details>"
        + growth
    )


def allocations(allocs: Allocations | None) -> str:
    if allocs is None:
        return ""
    rows = [
        (
            f'<code title="{esc(chr(10).join(site.stack))}">{esc(site.site)}</code>',
            format_bytes(site.bytes, 2),
            _share_bar(site.share),
            str(site.count),
        )
        for site in allocs.sites
    ]
    if allocs.other_bytes:
        rows.append(("elsewhere", format_bytes(allocs.other_bytes, 2), "", ""))
    body = _table(
        ("Where (first frame of your code)", "Live bytes", "Share", "Blocks"), rows, "sites"
    )
    body += _pool_facts(allocs)
    if allocs.what_if:
        items = "".join(
            f"<li><strong>{esc(w.change)}</strong>: {esc(w.verdict)}"
            + (f' <span class="muted">({esc(" ".join(w.reasons))})</span>' if w.reasons else "")
            + "</li>"
            for w in allocs.what_if
        )
        body += f'<h3>What if</h3><ul class="what-if">{items}</ul>'
    lead = f"Live memory on GPU {allocs.device} by source line, from the snapshot "
    lead += f"<code>{esc(allocs.snapshot)}</code>"
    lead += f" (taken at {esc(allocs.reason)})." if allocs.reason else "."
    return _section("allocations", "Allocations", body, lead)


def _pool_facts(allocs: Allocations) -> str:
    pool = allocs.fragmentation
    facts = [
        (
            "failed request",
            format_bytes(allocs.requested_bytes, 2) if allocs.requested_bytes else None,
        ),
        ("reserved", format_bytes(pool.reserved_bytes, 2)),
        ("allocated", format_bytes(pool.allocated_bytes, 2)),
        ("cached, free", format_bytes(pool.free_bytes, 2)),
        ("free inside split segments", format_bytes(pool.inactive_split_bytes, 2)),
        ("largest free block", format_bytes(pool.largest_free_block_bytes, 2)),
        ("fragmentation (1 − largest free block / free)", format_percent(pool.ratio)),
        ("segments", str(pool.segments)),
    ]
    if pool.request_fits_largest_free is not None:
        fits = "yes" if pool.request_fits_largest_free else "no"
        facts.append(("request fits the largest free block", fits))
    items = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts if v is not None)
    return f'<h3>The pool</h3><dl class="facts">{items}</dl>'


def _share_bar(share: float) -> str:
    width = round(share * 100)
    bar = f'<span class="bar"><span style="width:{width}%"></span></span>'
    return f"{bar} {format_percent(share)}"


def ranks(rows: Sequence[RankRow], has_figure: bool) -> str:
    if not rows:
        return ""
    cells = [
        (
            esc(r.label)
            + (' <span class="badge bad">failed first</span>' if r.failed_first else ""),
            esc(r.host or "-"),
            format_bytes(r.peak_held_bytes)
            + (f" (GPU {r.peak_device})" if r.peak_device is not None else ""),
            f'<span class="{"bad-text" if r.ending.bad else ""}">{esc(r.ending.text)}</span>',
            f"+{r.offset_s:.1f} s",
        )
        for r in rows
    ]
    body = _figure("fig-ranks", has_figure) + _table(
        ("Trace", "Host", "Peak held", "How it ended", "Started"), cells, "ranks"
    )
    return _section("ranks", "Ranks", body, "Every trace of the run, on one wall-clock axis.")


def footer(data: ReportData) -> str:
    warnings = "".join(f"<li>{esc(w)}</li>" for w in data.warnings)
    listed = f'<ul class="warnings">{warnings}</ul>' if warnings else ""
    return (
        f"<footer>{listed}<p>Written by memdoc {esc(data.memdoc_version)}. "
        "This file is self-contained: it loads nothing from the network.</p></footer>"
    )
