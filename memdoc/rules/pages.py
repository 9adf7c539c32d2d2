"""The documentation pages of the catalogue (docs/rules/), rendered from the rules themselves."""

from __future__ import annotations

from memdoc.rules.base import Rule, RunRule
from memdoc.rules.registry import all_rules, all_run_rules

INDEX = "README.md"


def page_name(slug: str) -> str:
    return f"{slug}.md"


def render_pages() -> dict[str, str]:
    """{file name: Markdown} for every rule's page and the index."""
    rules: list[Rule | RunRule] = [*all_rules(), *all_run_rules()]
    pages = {page_name(r.slug): r.doc for r in rules}
    pages[INDEX] = render_index()
    return pages


def render_index() -> str:
    """The index: every rule's code, slug and title, linked to its page."""
    lines = [
        "# The memdoc rule catalogue",
        "",
        "Each rule names one documented reason a job runs out of memory. `memdoc explain` (from an",
        "error text) and `memdoc diagnose` (from a trace) report the ones that apply, most",
        "confident first; `memdoc rules SLUG` prints a page in the terminal.",
        "",
        "How sure a finding is (strong, likely, possible, weak) follows from the signals its rule",
        "found, on one scale for every rule: see [the confidence scale](../confidence.md).",
        "",
        "These pages are generated from the rules' own documentation: edit the rule, then run",
        "`MEMDOC_UPDATE_DOCS=1 pytest tests/rules/test_docs.py`.",
        "",
        "| code | slug | what it is |",
        "|---|---|---|",
    ]
    lines += [f"| {r.code} | [`{r.slug}`]({page_name(r.slug)}) | {r.title} |" for r in all_rules()]
    lines += ["", "Across ranks (several traces of one run):", "", "| code | slug | what it is |"]
    lines += ["|---|---|---|"]
    lines += [
        f"| {r.code} | [`{r.slug}`]({page_name(r.slug)}) | {r.title} |" for r in all_run_rules()
    ]
    return "\n".join(lines) + "\n"
