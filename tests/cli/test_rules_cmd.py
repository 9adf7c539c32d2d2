"""`memdoc rules`: the catalogue and each rule's documentation, from the command line."""

from __future__ import annotations

from memdoc.rules.base import Rule, RunRule
from memdoc.rules.registry import RULES, RUN_RULES
from tests.conftest import run_memdoc


def test_rules_lists_every_rule_with_code_slug_and_title() -> None:
    result = run_memdoc("rules")

    out = result.stdout.decode()
    assert result.returncode == 0
    every: list[Rule | RunRule] = [*RULES.values(), *RUN_RULES.values()]
    for rule in every:
        assert f"{rule.code}  {rule.slug:<28} {rule.title}\n" in out


def test_rules_slug_prints_that_rules_documentation() -> None:
    result = run_memdoc("rules", "host-oom")

    assert result.returncode == 0
    assert result.stdout.decode() == RULES["host-oom"].doc


def test_rules_accepts_a_code_too() -> None:
    result = run_memdoc("rules", "MD001")

    assert result.stdout.decode() == RULES["fragmentation"].doc


def test_an_unknown_slug_is_one_error_line_with_the_closest_slug_as_hint() -> None:
    result = run_memdoc("rules", "host-om")

    err = result.stderr.decode().splitlines()
    assert result.returncode == 2
    assert err == [
        "memdoc: error: no rule named 'host-om'",
        "memdoc: hint: did you mean host-oom? `memdoc rules` lists them all",
    ]
