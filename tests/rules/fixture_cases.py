"""Read the rule fixtures: every folder under tests/fixtures/rules/ is one rule's cases."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memdoc.oom import parse_text
from memdoc.rules.text_trace import text_trace
from memdoc.trace import Trace, load_trace
from memdoc.trace.reader import Run

RULE_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "rules"
GOLDEN = RULE_FIXTURES / "golden"
NOT_A_RULE = {"golden"}


@dataclass(frozen=True)
class Case:
    """One fixture file (or folder of rank traces) and what the rule must say about it."""

    slug: str
    file: str
    expect: str  # strong | likely | possible | weak | none
    rank: int | None = None

    @property
    def path(self) -> Path:
        return RULE_FIXTURES / self.slug / self.file

    @property
    def id(self) -> str:
        return f"{self.slug}/{self.file}"

    def trace(self) -> Trace:
        """The fixture as the rules see it: a loaded trace, or a text-only one."""
        if self.path.suffix == ".memdoc":
            return load_trace(self.path)
        text = self.path.read_text(encoding="utf-8")
        oom = parse_text(text)
        assert oom is not None, f"{self.id}: the parser finds no memory error in it"
        return text_trace(text, oom)

    def run(self) -> Run:
        return Run([load_trace(p) for p in sorted(self.path.glob("*.memdoc"))])


def rule_folders() -> list[Path]:
    return sorted(p for p in RULE_FIXTURES.iterdir() if p.is_dir() and p.name not in NOT_A_RULE)


def all_cases() -> list[Case]:
    cases: list[Case] = []
    for folder in rule_folders():
        listed = json.loads((folder / "cases.json").read_text(encoding="utf-8"))["cases"]
        cases += [Case(folder.name, c["file"], c["expect"], c.get("rank")) for c in listed]
    return cases
