"""Run the catalogue: diagnose a trace, a run of several ranks, or an error text."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memdoc.oom import parse_text
from memdoc.oom.lookalike import BARE_BAD_ALLOC, bare_bad_alloc, other_limit
from memdoc.rules.base import Finding, Rule, RunRule
from memdoc.rules.confidence import (
    LIKELY,
    TEXT_ONLY_CAP,
    TEXT_ONLY_REASON,
    capped,
)
from memdoc.rules.context import Facts
from memdoc.rules.priors import (
    BARE_CAUSES,
    INCIDENTS,
    INCIDENTS_BY_CAUSE,
    common_causes,
    is_bare,
    on_gpu,
    prior_rank,
)
from memdoc.rules.ranks import rank_of
from memdoc.rules.registry import NODE_RULES, RULES, all_rules, all_run_rules
from memdoc.rules.spec import count_evidence
from memdoc.rules.text_trace import text_trace
from memdoc.rules.words import explain_in_words
from memdoc.trace.model import OomInfo
from memdoc.trace.reader import Run, Trace

__all__ = [
    "Explanation",
    "Findings",
    "check_rule",
    "diagnose",
    "diagnose_run",
    "explain_in_words",
    "explain_text",
    "sort_findings",
    "to_json",
]


class Findings(list[Finding]):
    """Findings, most confident first, and `warnings`: what could not be judged (a rule
    that failed on this trace, named so that the others' findings still count)."""

    def __init__(self, findings: Iterable[Finding] = (), warnings: Iterable[str] = ()) -> None:
        super().__init__(findings)
        self.warnings = list(warnings)


def diagnose(trace: Trace, rules: Sequence[Rule] | None = None) -> Findings:
    """Every rule's finding on this trace, most confident first. The trace is not changed.

    A rule that raises is left out and named in the result's `warnings`: one broken rule
    must not hide what the others found.
    """
    findings: list[Finding] = []
    warnings: list[str] = []
    facts = Facts(trace)  # every rule asks the same questions of this trace: answered once
    for rule in [*all_rules(), *NODE_RULES] if rules is None else rules:
        try:
            finding = check_rule(rule, facts)
        except Exception as exc:
            warnings.append(
                f"rule {rule.slug} failed on this trace ({type(exc).__name__}: {exc}); "
                "its finding is left out"
            )
            continue
        if finding is not None:
            findings.append(finding)
    return Findings(sort_findings(findings), warnings)


def check_rule(rule: Rule, trace: Trace | Facts) -> Finding | None:
    """One rule's finding, claiming no more than an error text alone can show.

    A cause that is a behaviour over time (the rule `needs_recording`) cannot be seen in
    one error text: from a text-only trace it is at most TEXT_ONLY_CAP.
    """
    facts = trace if isinstance(trace, Facts) else Facts(trace)
    finding = rule.check(facts)
    if finding is None or not facts.is_text_only or not rule.needs_recording:
        return finding
    confidence = capped(finding.confidence, TEXT_ONLY_CAP)
    if confidence == finding.confidence:
        return finding
    reasons = (*finding.reasons, TEXT_ONLY_REASON)
    return dataclasses.replace(finding, confidence=confidence, reasons=reasons)


def diagnose_run(run: Run, run_rules: Sequence[RunRule] | None = None) -> Findings:
    """Findings of every rank, merged per rule, plus the cross-rank findings."""
    if len(run.traces) == 1:
        return diagnose(run.traces[0])
    per_trace = [(trace, diagnose(trace)) for trace in run.traces]
    warnings = [w for _, found in per_trace for w in found.warnings]
    per_rank = [
        dataclasses.replace(f, rank=rank_of(run, trace))
        for trace, found in per_trace
        for f in found
    ]
    findings = _merge_ranks(per_rank, len(run.traces))
    for rule in all_run_rules() if run_rules is None else run_rules:
        try:
            findings.extend(rule.check_run(run))
        except Exception as exc:
            warnings.append(
                f"rule {rule.slug} failed on this run ({type(exc).__name__}: {exc}); "
                "its finding is left out"
            )
    return Findings(sort_findings(findings), warnings)


def _merge_ranks(findings: Iterable[Finding], ranks: int) -> list[Finding]:
    """One finding per rule: the most confident rank's, saying where else it was seen."""
    by_rule: dict[str, list[Finding]] = {}
    for finding in findings:
        by_rule.setdefault(finding.rule, []).append(finding)
    merged: list[Finding] = []
    for same in by_rule.values():
        best = max(same, key=lambda f: f.confidence)
        seen = sorted({f.rank for f in same if f.rank is not None})
        if len(seen) > 1:
            note = count_evidence(
                f"ranks where it was seen ({', '.join(map(str, seen))}) of {ranks}", len(seen)
            )
            best = dataclasses.replace(best, evidence=(*best.evidence, note))
        merged.append(best)
    return merged


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most confident first; at equal confidence the cause real incidents show more often."""
    return sorted(findings, key=lambda f: (-f.confidence, prior_rank(f.rule), f.code))


@dataclass(frozen=True)
class Explanation:
    """What `memdoc explain` says about a text: its last memory error, and why."""

    oom: OomInfo | None
    findings: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # With no memory error: why memory's words in the text were not read as one, if they were.
    not_memory: str | None = None


def explain_text(text: str) -> Explanation:
    """The last memory error in a text and what the catalogue says about it.

    A text with no memory error gives an explanation with no OOM and no findings.
    """
    oom = parse_text(text)
    if oom is None:
        return Explanation(None, not_memory=other_limit(text[-_LIMIT_TAIL_CHARS:]))
    if bare_bad_alloc(oom, text[-_LIMIT_TAIL_CHARS:]):
        return Explanation(None, not_memory=BARE_BAD_ALLOC)
    trace = text_trace(text, oom)
    found = diagnose(trace)
    warnings = [*trace.warnings, *found.warnings]
    findings: list[Finding] = found
    if is_bare(oom):
        findings = sort_findings([*findings, *_common_causes(trace, oom, findings, BARE_WHY)])
        warnings.append(BARE_WARNING)
    elif on_gpu(oom) and not any(f.confidence >= LIKELY.base for f in findings):
        findings = sort_findings([*findings, *_common_causes(trace, oom, findings, UNSURE_WHY)])
    return Explanation(oom, findings, warnings)


# Where a text without a memory error is searched for a limit it names: its end.
_LIMIT_TAIL_CHARS = 20_000

BARE_WHY = "The error gives no figures for the device, so the text alone cannot tell"
UNSURE_WHY = "No cause stands out in the error's figures"


BARE_WARNING = (
    "the error gives no figures for the device, so the text alone cannot tell the cause: "
    "the causes are ordered by how often each ended real incidents"
)


def _common_causes(trace: Trace, oom: OomInfo, found: Sequence[Finding], why: str) -> list[Finding]:
    """Weak findings for the most common causes of a device error, not found otherwise."""
    named = {f.rule for f in found}
    added: list[Finding] = []
    # The commonest causes the error's own figures do not rule out.
    candidates = [
        slug
        for slug in common_causes(oom.framework, None)
        if slug in RULES and not RULES[slug].ruled_out_by(oom)
    ]
    for slug in candidates[:BARE_CAUSES]:
        if slug in named:
            continue
        count = INCIDENTS_BY_CAUSE[slug]
        summary = (
            f"{why}; this cause ended {count} of {INCIDENTS} real incidents in memdoc's corpus."
        )
        evidence = [count_evidence("real incidents with this cause", count)]
        added.append(
            RULES[slug].common_cause(
                Facts(trace),
                summary,
                evidence,
                to_confirm="rerun under `memdoc run` to record what filled the memory",
                frameworks=[oom.framework],
            )
        )
    return added


def to_json(oom: OomInfo | None, findings: Sequence[Finding]) -> dict[str, Any]:
    """The output contract of `memdoc explain --json` and `memdoc diagnose --json`."""
    return {
        "oom": oom.to_dict() if oom is not None else None,
        "findings": [f.to_dict() for f in findings],
    }
