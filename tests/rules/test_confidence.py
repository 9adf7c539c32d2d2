"""The one confidence scale: the word follows from the signals, never from a nudge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memdoc.rules
from memdoc.rules.confidence import (
    LIKELY,
    POSSIBLE,
    STRONG,
    TEXT_ONLY_CAP,
    TEXT_ONLY_REASON,
    WEAK,
    Level,
    Signals,
    capped,
    confidence_word,
)
from memdoc.rules.engine import explain_text

RULES_DIR = Path(memdoc.rules.__file__).parent


@pytest.mark.parametrize("level", list(Level), ids=lambda lv: lv.word)
@pytest.mark.parametrize("count", range(8))
def test_corroboration_never_lifts_a_finding_into_the_next_word(level: Level, count: int) -> None:
    signals = Signals(level, frozenset(f"signal-{i}" for i in range(count)))

    assert signals.word == level.word
    assert confidence_word(signals.confidence) == level.word


def test_two_weak_signals_do_not_make_a_strong_one() -> None:
    two_weak = Signals.of(WEAK, also=True, and_also=True)

    assert two_weak.word == "weak"
    assert two_weak.confidence < Signals(POSSIBLE).confidence


def test_one_signal_counted_twice_is_still_one_signal() -> None:
    once = Signals.of(LIKELY, failed_there=True)
    twice = once.plus(failed_there=True)

    assert twice == once
    assert once.confidence > Signals(LIKELY).confidence


def test_more_independent_signals_rank_higher_within_a_word() -> None:
    ranked = [Signals.of(POSSIBLE, **{f"s{i}": True for i in range(n)}) for n in range(4)]

    assert [s.confidence for s in ranked] == sorted({s.confidence for s in ranked})


def test_a_cap_lowers_the_word_and_keeps_a_finding_inside_it() -> None:
    assert Signals.of(STRONG, a=True).at_most(POSSIBLE).word == "possible"
    assert capped(Signals(STRONG).confidence, TEXT_ONLY_CAP) == POSSIBLE.base
    assert capped(Signals.of(POSSIBLE, a=True).confidence, TEXT_ONLY_CAP) == 0.45


def test_a_cause_over_time_claims_no_more_than_the_text_cap_from_a_text() -> None:
    # retain_graph=True in a traceback is the rule's signal; growth per step needs a recording.
    text = (
        'Traceback (most recent call last):\n  File "train.py", line 40, in train\n'
        "    loss.backward(retain_graph=True)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n"
    )

    found = {f.rule: f for f in explain_text(text).findings}

    assert "retain-graph" in found
    assert confidence_word(found["retain-graph"].confidence) == TEXT_ONLY_CAP.word


def _nudges(path: Path) -> list[str]:
    """Arithmetic on a level name (`LIKELY + 0.1`) or a float passed as a confidence."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.BinOp):
            names = [n.id for n in (node.left, node.right) if isinstance(n, ast.Name)]
            if any(n in Level.__members__ for n in names):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_rule_nudges_a_level_by_hand() -> None:
    nudged = [hit for path in sorted(RULES_DIR.rglob("*.py")) for hit in _nudges(path)]

    assert nudged == []


def test_a_finding_says_what_corroborated_it_in_the_terminal_the_report_and_json() -> None:
    from memdoc.report.html import render_html
    from memdoc.rules.engine import diagnose
    from memdoc.trace import load_trace
    from memdoc.trace.reader import Run
    from tests.rules.fixture_cases import RULE_FIXTURES

    trace = load_trace(RULE_FIXTURES / "leak-across-steps" / "hit-torch-weight-snapshots.memdoc")
    leak = next(f for f in diagnose(trace) if f.rule == "leak-across-steps")

    assert leak.reasons == ("ended in failure", "grew by half")
    assert leak.to_dict()["confidence_reasons"] == ["ended in failure", "grew by half"]
    html = render_html(Run([trace]), [leak])
    assert "corroborated by: ended in failure; grew by half" in html


def test_a_finding_capped_from_an_error_text_says_so() -> None:
    from memdoc.oom import parse_text
    from memdoc.rules.base import Finding
    from memdoc.rules.engine import check_rule
    from memdoc.rules.text_trace import text_trace

    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n"
    oom = parse_text(text)
    assert oom is not None

    class OverTime:  # a cause that is a behaviour over time, sure of itself from a text
        slug, code, title, doc = "over-time", "MD999", "t", ""
        needs_recording = True

        def check(self, facts: object) -> Finding:
            return Finding("over-time", "MD999", "t", 0.85, "s", reasons=("grew by half",))

    found = check_rule(OverTime(), text_trace(text, oom))  # type: ignore[arg-type]

    assert found is not None and confidence_word(found.confidence) == POSSIBLE.word
    assert found.reasons == ("grew by half", TEXT_ONLY_REASON)


@pytest.mark.parametrize(
    ("reasons", "line"),
    [
        (("ended in failure",), "corroborated by: ended in failure"),
        (("a", "capped: why"), "corroborated by: a · capped: why"),
        (("capped: why",), "capped: why"),
        ((), ""),
    ],
)
def test_the_confidence_line_puts_corroborations_first_and_caps_after(
    reasons: tuple[str, ...], line: str
) -> None:
    from memdoc.rules.confidence import confidence_line

    assert confidence_line(reasons) == line
