"""The three views of a comparison (terminal, markdown, JSON) on recorded runs: the same
rows, verdicts and findings in each, in words a person and a tool can read."""

from __future__ import annotations

import io
import json
import re

from memdoc.budget.compare import HOST_HELD_NOTE, compare, parse_budget
from memdoc.budget.figures import Figures, Place
from memdoc.budget.render import (
    change_words,
    render_terminal,
    to_json,
    to_markdown,
    verdict_line,
    verdict_words,
)
from memdoc.report.console import SafeConsole
from tests.budget.runs import figures_of

ANSI = re.compile("\x1b\\[")


def leak_comparison():  # type: ignore[no-untyped-def]
    return compare(figures_of("torch-base"), figures_of("torch-leak"), parse_budget(["5%"]))


def terminal(comparison, *, budget_given: bool = True) -> str:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    console = SafeConsole(file=out, width=120, color_system=None)
    render_terminal(comparison, console, budget_given=budget_given)
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


def test_the_terminal_names_both_runs_each_figure_and_its_verdict() -> None:
    text = terminal(leak_comparison())

    assert "memdoc compare · torch_train.py" in text
    assert re.search(r"base\s+\S*torch-base.memdoc.gz\s+30 steps, ended ok", text)
    assert re.search(r"new\s+\S*torch-leak.memdoc.gz\s+30 steps, ended ok", text)
    assert re.search(
        r"peak used\s+612.6 MiB\s+728.3 MiB\s+\+115.6 MiB \(\+18.9%\)\s+over: "
        r"\+18.9% > 5%",
        text,
    )
    assert re.search(r"growth per step .* over: adds 123.3 MiB over 30 steps > 30.6 MiB", text)
    assert re.search(r"step of the peak\s+25\s+30\s+\+5\n", text)
    assert "leak-across-steps  Memory kept alive step after step" in text
    assert text.rstrip().splitlines()[-1] == "over budget: 3 figures"


def test_runs_within_budget_end_with_within_budget_and_ok_verdicts() -> None:
    comparison = compare(
        figures_of("torch-base"), figures_of("torch-base-again"), parse_budget(["5%"])
    )

    text = terminal(comparison)

    assert text.rstrip().splitlines()[-1] == "within budget"
    assert re.search(r"peak used .*\bok$", text, re.MULTILINE)
    assert re.search(r"growth per step .* ok: adds [\d.]+ \w+ over 30 steps$", text, re.MULTILINE)


def test_without_a_budget_there_is_no_budget_column_and_it_says_so() -> None:
    comparison = compare(figures_of("torch-base"), figures_of("torch-leak"))

    text = terminal(comparison, budget_given=False)

    assert "budget" not in text.splitlines()[5]
    assert text.rstrip().splitlines()[-1] == "no budget given"
    assert verdict_line(comparison, budget_given=False) == "no budget given"


def test_markdown_is_one_table_with_findings_and_notes_and_no_ansi() -> None:
    comparison = compare(
        figures_of("torch-base"), figures_of("jax-leak"), parse_budget(["5%"]), any_program=True
    )

    text = to_markdown(comparison, budget_given=True)

    lines = text.splitlines()
    assert lines[0].startswith("### memdoc compare: torch_train.py and jax_train.py: over budget")
    assert "| place | figure | base | new | change | budget |" in lines
    assert "|---|---|--:|--:|--:|---|" in lines
    table = [line for line in lines if line.startswith("| host |")]
    assert len(table) == len(comparison.rows)
    assert all(line.count(" | ") == 5 for line in table)
    assert "| host | growth per step |" in text and "**over: adds" in text
    assert "- `leak-across-steps`: Memory kept alive step after step" in lines
    assert not ANSI.search(text) and text.isprintable() is False  # newlines only
    assert all(line.isprintable() for line in lines)


def test_markdown_cells_cannot_break_the_table_or_the_terminal() -> None:
    hostile = "evil|name\x1b[31m`.py"
    base = Figures(hostile, (), (), 3, {"host": Place("host", "host", None, {"peak_used": 1.0})})
    comparison = compare(base, base, parse_budget(["5%"]))

    text = to_markdown(comparison, budget_given=True)

    assert "evil\\|name\\x1b[31m" in text and "\x1b" not in text
    row = next(line for line in text.splitlines() if line.startswith("| host |"))
    assert row.count(" | ") == 5


def test_json_has_both_runs_every_row_and_the_verdict() -> None:
    comparison = leak_comparison()

    out = json.loads(json.dumps(to_json(comparison, budget_given=True)))

    assert {"base", "new", "rows", "appeared", "gone", "notes", "over_budget"} <= set(out)
    assert out["over_budget"] is True
    assert out["base"]["memdoc_baseline"] == 1 and out["base"]["program"] == "torch_train.py"
    assert Figures.from_dict(out["new"]).places.keys() == {"host"}, "a baseline as it is"
    assert len(out["rows"]) == len(comparison.rows)
    for row in out["rows"]:
        assert set(row) >= {
            "place",
            "figure",
            "base",
            "new",
            "change",
            "change_share",
            "allowed",
            "over",
            "why",
        }
    growth = next(r for r in out["rows"] if r["figure"] == "growth_per_step")
    assert growth["over"] is True and growth["why"] == "adds 123.3 MiB over 30 steps"
    assert out["appeared"] == [
        {"rule": "leak-across-steps", "title": "Memory kept alive step after step"}
    ]
    assert out["gone"] == []
    assert out["notes"] == [HOST_HELD_NOTE], "RSS grew 16.5%, beyond the bare budget"


def test_words_of_a_change_and_a_verdict() -> None:
    comparison = leak_comparison()
    rows = {r.figure: r for r in comparison.rows}

    assert change_words(rows["peak_used"]) == "+115.6 MiB (+18.9%)"
    assert change_words(rows["growth_per_step"]) == "+4.1 MiB", "no share of a growth rate"
    assert change_words(rows["peak_step"]) == "+5"
    assert verdict_words(rows["peak_used"], 30) == "over: +18.9% > 5%"
    assert verdict_words(rows["peak_step"], 30) == ""
    by_bytes = compare(comparison.base, comparison.new, parse_budget(["64MiB"]))
    used = next(r for r in by_bytes.rows if r.figure == "peak_used")
    assert verdict_words(used, 30) == "over: +115.6 MiB > 64.0 MiB"
