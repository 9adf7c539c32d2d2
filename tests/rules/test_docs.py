"""docs/rules/ is the catalogue's own documentation, page for page, and never drifts from it."""

from __future__ import annotations

import os
from pathlib import Path

from memdoc.rules.pages import render_pages

DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "rules"


def test_docs_rules_holds_exactly_the_generated_pages() -> None:
    pages = render_pages()
    if os.environ.get("MEMDOC_UPDATE_DOCS"):
        DOCS.mkdir(parents=True, exist_ok=True)
        for old in DOCS.glob("*.md"):
            if old.name not in pages:
                old.unlink()
        for name, text in pages.items():
            (DOCS / name).write_text(text, encoding="utf-8")

    on_disk = {p.name: p.read_text(encoding="utf-8") for p in DOCS.glob("*.md")}

    assert sorted(on_disk) == sorted(pages), "pages missing or left over in docs/rules"
    stale = [name for name, text in pages.items() if on_disk[name] != text]
    assert stale == [], f"out of date (run with MEMDOC_UPDATE_DOCS=1): {stale}"


def test_index_links_every_page() -> None:
    pages = render_pages()
    index = pages.pop("README.md")
    for name in pages:
        assert f"]({name})" in index
