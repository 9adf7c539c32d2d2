"""Every rule has a hit and a near miss on real data, and says each with the expected certainty."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

import pytest

from memdoc.rules.confidence import confidence_word
from memdoc.rules.context import Facts
from memdoc.rules.engine import check_rule
from memdoc.rules.registry import RULES, RUN_RULES
from tests.rules.fixture_cases import RULE_FIXTURES, Case, all_cases, rule_folders
from tests.rules.scenarios import SCENARIOS, build_all

CASES = all_cases()


def test_every_registered_rule_has_a_fixture_folder_and_every_folder_a_rule() -> None:
    folders = {p.name for p in rule_folders()}
    registered = set(RULES) | set(RUN_RULES)
    assert registered - folders == set(), "rules without fixtures"
    assert folders - registered == set(), "fixture folders for no rule"


@pytest.mark.parametrize("slug", sorted(set(RULES) | set(RUN_RULES)))
def test_every_rule_has_a_hit_and_a_near_miss(slug: str) -> None:
    mine = [c for c in CASES if c.slug == slug]
    assert any(c.expect != "none" for c in mine), f"{slug}: no hit"
    assert any(c.expect == "none" for c in mine), f"{slug}: no near miss"


def test_every_fixture_file_is_listed_in_its_cases() -> None:
    listed = {c.path for c in CASES}
    on_disk = {p for folder in rule_folders() for p in folder.iterdir() if p.name != "cases.json"}
    assert on_disk == listed


@pytest.mark.parametrize("case", [c for c in CASES if c.slug in RULES], ids=lambda c: c.id)
def test_rule_fires_on_its_hits_and_stays_quiet_on_near_misses(case: Case) -> None:
    finding = check_rule(RULES[case.slug], case.trace())

    if case.expect == "none":
        assert finding is None, finding and finding.summary
        return
    assert finding is not None
    assert confidence_word(finding.confidence) == case.expect, (finding.confidence, finding.summary)
    assert (finding.rule, finding.code) == (case.slug, RULES[case.slug].code)
    assert finding.fixes, "a finding always says what to change"


@pytest.mark.parametrize("case", [c for c in CASES if c.slug in RUN_RULES], ids=lambda c: c.id)
def test_cross_rank_rule_fires_on_its_hits_and_names_the_rank(case: Case) -> None:
    rule = RUN_RULES[case.slug]
    if case.path.is_file():  # one trace of a whole node (`memdoc run -- torchrun`)
        one = rule.check(Facts(case.trace()))
        found = [one] if one is not None else []
    else:
        found = rule.check_run(case.run())

    if case.expect == "none":
        assert found == []
        return
    assert [confidence_word(f.confidence) for f in found] == [case.expect]
    assert found[0].rank == case.rank


def test_evidence_carries_numbers_with_units() -> None:
    for case in CASES:
        if case.slug not in RULES or case.expect == "none":
            continue
        finding = check_rule(RULES[case.slug], case.trace())
        assert finding is not None
        for evidence in finding.evidence:
            assert evidence.text
            assert evidence.value is None or evidence.unit, (case.id, evidence)


def test_stored_traces_are_what_their_builders_write(tmp_path: Path) -> None:
    if os.environ.get("MEMDOC_UPDATE_FIXTURES"):
        build_all(RULE_FIXTURES)
    build_all(tmp_path)
    for relative in SCENARIOS:
        assert filecmp.cmp(tmp_path / relative, RULE_FIXTURES / relative, shallow=False), (
            f"{relative} differs from its builder; rebuild with MEMDOC_UPDATE_FIXTURES=1"
        )
