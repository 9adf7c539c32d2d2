"""Two runs compared, shown: rich tables for the terminal, a markdown table for a pull
request's comment, and one JSON object for tools. Every view says the same things in the
same words: per place the figures of both runs, the change, and the budget's verdict; the
findings that appeared or went away; what was not compared; and the overall verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from memdoc.budget.compare import Comparison, Row
from memdoc.budget.figures import GROWTH_PER_STEP, Figures, figure_words, is_bytes
from memdoc.printable import printable
from memdoc.units import format_bytes

NO_BUDGET = "no budget given"
WITHIN_BUDGET = "within budget"


# -- words every view shares ---------------------------------------------------------------


def value_words(figure: str, value: float | None) -> str:
    """A figure's value: bytes in binary units, a step as a plain number, '-' unknown."""
    if value is None:
        return "-"
    return format_bytes(value) if is_bytes(figure) else f"{round(value):d}"


def signed_share(share: float) -> str:
    return f"{share * 100:+.1f}%"


def signed_bytes(amount: float) -> str:
    return ("+" if amount > 0 else "") + format_bytes(amount)


def change_words(row: Row) -> str:
    """ "+115.7 MiB (+18.9%)", "+5" for a step, '-' where one run did not measure it."""
    change = row.change
    if change is None:
        return "-"
    if not is_bytes(row.figure):
        return f"{round(change):+d}"
    share = row.change_share
    words = signed_bytes(change)
    # A share of a growth rate says little: from 20 KiB a step to 4 MiB is "+20000%".
    if share is None or not change or row.figure == GROWTH_PER_STEP:
        return words
    return f"{words} ({signed_share(share)})"


def verdict_words(row: Row, new_steps: int) -> str:
    """The budget's verdict on one row: "over: +7.3% > 5%", "ok", "" (no budget for it)."""
    limit = row.limit
    if limit is None or not is_bytes(row.figure):
        return ""
    if row.allowed is None:
        return "not judged: not measured in both runs"
    word = "over" if row.over else "ok"
    if row.figure == GROWTH_PER_STEP:
        allowed_total = row.allowed * new_steps
        if row.over:
            return f"{word}: {row.why} > {format_bytes(allowed_total)}"
        return f"{word}: {row.why}" if row.why else word
    if not row.over:
        return word
    change = row.change or 0.0
    share = row.change_share
    if limit.share is not None and share is not None:
        return f"{word}: {signed_share(share)} > {limit.words()}"
    return f"{word}: {signed_bytes(change)} > {format_bytes(row.allowed)}"


def verdict_line(comparison: Comparison, *, budget_given: bool) -> str:
    """The last line: "within budget", "over budget: 2 figures (...)", "no budget given"."""
    if not budget_given:
        return NO_BUDGET
    over = len(comparison.over)
    if not over:
        return WITHIN_BUDGET
    return f"over budget: {over} figure{'s' if over != 1 else ''}"


def run_words(figures: Figures) -> str:
    """ "30 steps, ended ok": what a run did, for the header."""
    steps = f"{figures.steps:,} step{'s' if figures.steps != 1 else ''}"
    return f"{steps}, ended {figures.ended or 'unknown'}"


def places_of(comparison: Comparison) -> list[tuple[str, str, list[Row]]]:
    """(place, its label, its rows), in the order the rows came."""
    out: dict[str, tuple[str, list[Row]]] = {}
    for row in comparison.rows:
        out.setdefault(row.place, (row.place_label, []))[1].append(row)
    return [(name, label, rows) for name, (label, rows) in out.items()]


def finding_titles(comparison: Comparison) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(slug, title) of the findings that appeared in the new run, and of those gone."""
    new_titles = {f.rule: f.title for f in comparison.new.findings}
    base_titles = {f.rule: f.title for f in comparison.base.findings}
    return (
        [(slug, new_titles.get(slug, "")) for slug in comparison.appeared],
        [(slug, base_titles.get(slug, "")) for slug in comparison.gone],
    )


def _program_words(comparison: Comparison) -> str:
    base, new = comparison.base.program, comparison.new.program
    if base == new or not new:
        return base or "a program"
    return f"{base or 'a program'} and {new}"


# -- the terminal --------------------------------------------------------------------------


def render_terminal(comparison: Comparison, console: Console, *, budget_given: bool) -> None:
    """Print the comparison: the two runs, a table per place, findings, notes, verdict."""
    console.print(_header(comparison))
    for _name, label, rows in places_of(comparison):
        console.print(_place_table(label, rows, comparison.new.steps, budget_given))
    appeared, gone = finding_titles(comparison)
    for heading, found, style in (
        ("Findings only in the new run", appeared, "bold red"),
        ("Findings gone in the new run", gone, "green"),
    ):
        if found:
            console.print(Text(f"\n{heading}", style="bold underline"))
            for slug, title in found:
                console.print(Text.assemble(("  • ", ""), (slug, style), (f"  {title}", "")))
    if comparison.notes:
        console.print(Text(""))
        for note in comparison.notes:
            console.print(Text(f"note: {note}", style="yellow"))
    line = verdict_line(comparison, budget_given=budget_given)
    style = "bold red" if comparison.over and budget_given else "bold green"
    console.print(Text(f"\n{line}", style=style if budget_given else "dim"))


def _header(comparison: Comparison) -> RenderableType:
    title = Text(f"memdoc compare · {_program_words(comparison)}", style="bold")
    runs = Table.grid(padding=(0, 2))
    runs.add_column(style="dim")
    runs.add_column()
    runs.add_column()
    for word, figures in (("base", comparison.base), ("new", comparison.new)):
        runs.add_row(word, Text(figures.source or figures.program), Text(run_words(figures)))
    return Group(title, runs)


def _place_table(label: str, rows: Sequence[Row], new_steps: int, budget_given: bool) -> Table:
    table = Table(
        title=Text(f"\n{label}", style="bold underline"),
        title_justify="left",
        box=None,
        header_style="dim",
        pad_edge=False,
    )
    columns = [("figure", "left"), ("base", "right"), ("new", "right"), ("change", "right")]
    if budget_given:
        columns.append(("budget", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        cells: list[Text | str] = [
            figure_words(row.figure),
            value_words(row.figure, row.base),
            Text(value_words(row.figure, row.new), style="bold"),
            change_words(row),
        ]
        if budget_given:
            verdict = verdict_words(row, new_steps)
            style = "bold red" if row.over else ("green" if verdict.startswith("ok") else "dim")
            cells.append(Text(verdict, style=style))
        table.add_row(*cells)
    return table


# -- markdown ------------------------------------------------------------------------------


def to_markdown(comparison: Comparison, *, budget_given: bool) -> str:
    """A GitHub-flavoured markdown comment: a title, one table, findings, notes. Plain text:
    what came from the runs is made printable and cannot break out of its table cell."""
    verdict = verdict_line(comparison, budget_given=budget_given)
    lines = [
        f"### memdoc compare: {_cell(_program_words(comparison))}: {_cell(verdict)}",
        "",
    ]
    for word, figures in (("base", comparison.base), ("new", comparison.new)):
        where = f"`{_code(figures.source)}`, " if figures.source else ""
        lines.append(f"- {word}: {where}{_cell(run_words(figures))}")
    lines += [
        "",
        "| place | figure | base | new | change | budget |",
        "|---|---|--:|--:|--:|---|",
    ]
    for row in comparison.rows:
        verdict_cell = verdict_words(row, comparison.new.steps)
        if row.over:
            verdict_cell = f"**{verdict_cell}**"
        cells = (
            row.place,
            figure_words(row.figure),
            value_words(row.figure, row.base),
            value_words(row.figure, row.new),
            change_words(row),
            verdict_cell,
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    appeared, gone = finding_titles(comparison)
    for heading, found in (("Findings only in the new run", appeared), ("Findings gone", gone)):
        if found:
            lines += ["", f"{heading}:", ""]
            lines += [f"- `{_code(slug)}`: {_cell(title)}" for slug, title in found]
    if comparison.notes:
        lines.append("")
        lines += [f"> {_cell(note)}" for note in comparison.notes]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text for a markdown line or table cell: one printable line, its pipes escaped."""
    return printable(text).replace("\n", " ").replace("|", "\\|")


def _code(text: str) -> str:
    return printable(text).replace("\n", " ").replace("`", "'")


# -- JSON ----------------------------------------------------------------------------------


def to_json(comparison: Comparison, *, budget_given: bool) -> dict[str, Any]:
    """{"base", "new", "rows", "appeared", "gone", "notes", "over_budget", "verdict"}."""
    appeared, gone = finding_titles(comparison)
    return {
        "base": _figures_json(comparison.base),
        "new": _figures_json(comparison.new),
        "rows": [_row_json(row) for row in comparison.rows],
        "appeared": [{"rule": slug, "title": title} for slug, title in appeared],
        "gone": [{"rule": slug, "title": title} for slug, title in gone],
        "notes": list(comparison.notes),
        "budget_given": budget_given,
        "over_budget": bool(comparison.over) and budget_given,
        "verdict": verdict_line(comparison, budget_given=budget_given),
    }


def _figures_json(figures: Figures) -> dict[str, Any]:
    # The baseline format, and where it was read from: `base` or `new` saved alone is a
    # baseline `memdoc compare` reads.
    return {**figures.to_dict(), "source": figures.source}


def _row_json(row: Row) -> dict[str, Any]:
    return {
        "place": row.place,
        "figure": row.figure,
        "base": _number(row.base),
        "new": _number(row.new),
        "change": _number(row.change),
        "change_share": None if row.change_share is None else round(row.change_share, 6),
        "limit": None if row.limit is None else row.limit.words(),
        "allowed": _number(row.allowed),
        "over": row.over,
        "why": row.why,
    }


def _number(value: float | None) -> float | int | None:
    if value is None:
        return None
    return round(value) if abs(value) >= 1 else round(value, 6)
