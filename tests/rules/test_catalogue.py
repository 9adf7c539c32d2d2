"""The catalogue itself: stable codes, documentation with the fixed sections, pasteable fixes."""

from __future__ import annotations

import ast
import re

import pytest

from memdoc.rules.base import Fix, Rule, RunRule
from memdoc.rules.registry import RULES, RUN_RULES, all_rules, closest_slug, get_rule
from memdoc.rules.spec import FRAMEWORK_NAMES, fixes_for

# Codes are part of the interface (people grep and silence them): they never move.
STABLE_CODES = {
    "fragmentation": "MD001",
    "other-process": "MD002",
    "cuda-context-overhead": "MD003",
    "wrong-device": "MD004",
    "framework-preallocation": "MD005",
    "multi-framework": "MD006",
    "memory-fraction-cap": "MD007",
    "leak-across-steps": "MD008",
    "retain-graph": "MD009",
    "eval-without-no-grad": "MD010",
    "activations-too-large": "MD011",
    "single-allocation-too-large": "MD012",
    "model-too-large": "MD013",
    "optimizer-state": "MD014",
    "no-mixed-precision": "MD015",
    "cudnn-workspace": "MD016",
    "variable-shapes": "MD017",
    "checkpoint-load-spike": "MD018",
    "host-oom": "MD019",
    "xla-temp-buffers": "MD020",
    "cuda-graph-pools": "MD021",
    "nccl-buffers": "MD022",
    "rank-failed-first": "MD101",
    "rank-memory-skew": "MD102",
}
SECTIONS = ["## What it is", "## Why it happens", "## How to confirm", "## Fixes", "## References"]
EVERY_RULE: list[Rule | RunRule] = [*RULES.values(), *RUN_RULES.values()]


def test_every_documented_root_cause_is_registered_under_its_stable_code() -> None:
    assert {r.slug: r.code for r in EVERY_RULE} == STABLE_CODES
    assert [r.code for r in all_rules()] == [f"MD{i:03d}" for i in range(1, 23)]


@pytest.mark.parametrize("rule", EVERY_RULE, ids=lambda r: r.slug)
def test_documentation_has_the_fixed_sections_in_order(rule: Rule | RunRule) -> None:
    doc = rule.doc
    positions = [doc.find(section) for section in SECTIONS]
    assert -1 not in positions and positions == sorted(positions)
    assert doc.startswith(f"# {rule.code} `{rule.slug}`: {rule.title}")
    references = doc.split("## References")[1]
    assert re.search(r"\]\(https://[^)]+\)", references)


@pytest.mark.parametrize("rule", EVERY_RULE, ids=lambda r: r.slug)
def test_python_fixes_are_valid_code_and_shell_fixes_are_commands(rule: Rule | RunRule) -> None:
    fixes: tuple[Fix, ...] = rule.fixes  # type: ignore[union-attr]  # every catalogue rule has them
    assert fixes
    for fix in fixes:
        assert fix.framework in FRAMEWORK_NAMES  # a framework, Keras or "any"
        assert fix.language in ("python", "bash")
        if fix.language == "python":
            ast.parse(fix.code)  # raises on code a user could not paste
        assert fix.code == fix.code.strip() and fix.code


def test_a_rule_is_found_by_slug_or_code_and_a_typo_gets_the_closest_slug() -> None:
    assert get_rule("fragmentation") is RULES["fragmentation"]
    assert get_rule("md019") is RULES["host-oom"]
    assert get_rule("fragmentatoin") is None
    assert closest_slug("fragmentatoin") == "fragmentation"
    assert closest_slug("zzzz") is None


def test_fixes_shown_are_those_of_the_frameworks_involved() -> None:
    fixes = (Fix("pytorch", "a", "x = 1"), Fix("jax", "b", "y = 2"), Fix("any", "c", "z = 3"))

    assert [f.title for f in fixes_for(fixes, ["pytorch"])] == ["a", "c"]
    assert [f.title for f in fixes_for(fixes, [])] == ["a", "b", "c"]
