"""What every catalogue rule declares (identity, documentation, fixes) and how it reports."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

from memdoc.rules import confidence
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import Signals
from memdoc.rules.context import Facts
from memdoc.rules.host import cpu_only, no_gpu_seen
from memdoc.trace.model import FRAMEWORK_NAMES as PEOPLE_NAMES
from memdoc.trace.model import KERAS, UNWATCHED_FRAMEWORK_NAMES, OomInfo
from memdoc.trace.reader import Trace
from memdoc.units import format_bytes, format_duration, format_percent

# Fixes are written for a framework, for Keras (its own API, on whichever of the three it
# runs), or for any framework.
FRAMEWORK_NAMES = {**PEOPLE_NAMES, KERAS: "Keras", "any": "Any"}
# The word of a confidence, still importable from here; it is defined with the scale.
confidence_word = confidence.confidence_word


def snippet(text: str) -> str:
    """A fix's code written as an indented triple-quoted block, dedented and trimmed."""
    return textwrap.dedent(text).strip("\n")


class RuleSpec:
    """A catalogue rule: its identity, documentation parts, fixes, and `check`.

    Subclasses set the class attributes and implement `check`; `doc` is rendered from the
    parts so that the page, `memdoc rules SLUG` and a finding's fixes never disagree.
    """

    slug: str = ""
    code: str = ""
    title: str = ""
    host_title: str = ""  # the title on a run that used no GPU, where `title` names one
    what: str = ""
    why: str = ""
    confirm: str = ""
    fixes: tuple[Fix, ...] = ()
    references: tuple[tuple[str, str], ...] = ()  # (title, url)
    # True when the cause is a behaviour over time (growth across steps, a phase, a first
    # step): from an error text alone the engine lets it claim no more than TEXT_ONLY_CAP.
    needs_recording: bool = False

    def __init__(self) -> None:
        self.doc: str = render_doc(self)

    def check(self, facts: Facts) -> Finding | None:
        raise NotImplementedError

    def ruled_out_by(self, oom: OomInfo) -> bool:
        """True when the error's own figures rule this cause out (none do, unless a rule
        says which)."""
        return False

    def common_cause(
        self,
        facts: Facts,
        summary: str,
        evidence: Sequence[Evidence],
        *,
        to_confirm: str,
        frameworks: Sequence[str],
    ) -> Finding:
        """A weak finding of this cause, for an error whose text alone cannot tell."""
        return self.finding(
            facts,
            Signals(confidence.WEAK),
            summary,
            evidence,
            to_confirm=to_confirm,
            frameworks=frameworks,
        )

    def finding(
        self,
        facts: Facts,
        signals: Signals,
        summary: str,
        evidence: Iterable[Evidence],
        *,
        to_confirm: str | None = None,
        title: str | None = None,
        frameworks: Sequence[str] = (),
        extra: dict[str, Any] | None = None,
        fixes: Sequence[Fix] | None = None,
    ) -> Finding:
        """A finding of this rule, with the fixes for the frameworks involved.

        Its confidence follows from `signals` alone (see `memdoc.rules.confidence`).
        `fixes` narrows the rule's fixes to those the evidence calls for; `title` says what
        happened where the rule's own title would say more (a limit neared, not reached).
        """
        chosen = fixes_for(self.fixes if fixes is None else fixes, frameworks)
        trace = facts.trace
        host = cpu_only(trace)
        return Finding(
            rule=self.slug,
            code=self.code,
            title=title or self._title(trace),
            confidence=signals.confidence,
            summary=summary,
            evidence=tuple(evidence),
            fixes=fixes_for_host(chosen) if host else chosen,
            to_confirm=to_confirm,
            rank=trace.rank,
            extra=dict(extra or {}),
            reasons=signals.reasons,
        )

    def _title(self, trace: Trace) -> str:
        return self.host_title if self.host_title and no_gpu_seen(trace) else self.title


def fixes_for(fixes: Sequence[Fix], frameworks: Sequence[str]) -> tuple[Fix, ...]:
    """The fixes that apply to these frameworks (all of them when none is known; only the
    framework-neutral ones for a framework memdoc does not watch, such as Caffe)."""
    known = [f for f in frameworks if f in FRAMEWORK_NAMES and f != "any"]
    if not known and any(f in UNWATCHED_FRAMEWORK_NAMES for f in frameworks):
        return tuple(f for f in fixes if f.framework == "any")
    if not known:
        return tuple(fixes)
    chosen = tuple(f for f in fixes if f.framework == "any" or f.framework in known)
    return chosen or tuple(fixes)


# How a fix names the GPU it runs on, and what it says instead on a CPU-only run.
_ON_CPU = (
    ('device_type="cuda"', 'device_type="cpu"'),
    ('device="cuda"', 'device="cpu"'),
    ("torch.float16", "torch.bfloat16"),  # CPU autocast computes in bf16
    ('"mixed_float16"', '"mixed_bfloat16"'),
)


def fixes_for_host(fixes: Sequence[Fix]) -> tuple[Fix, ...]:
    """The fixes as they apply on a CPU-only run: GPU settings left out, devices renamed."""
    kept = [f for f in fixes if not f.gpu_only] or list(fixes)
    out = []
    for fix in kept:
        code = fix.code
        for gpu, cpu in _ON_CPU:
            code = code.replace(gpu, cpu)
        out.append(dataclasses.replace(fix, code=code))
    return tuple(out)


def render_doc(rule: RuleSpec) -> str:
    """The Markdown page of a rule, with the fixed sections in the fixed order."""
    parts = [
        f"# {rule.code} `{rule.slug}`: {rule.title}",
        "## What it is",
        rule.what.strip(),
        "## Why it happens",
        rule.why.strip(),
        "## How to confirm",
        rule.confirm.strip(),
        "## Fixes",
    ]
    for fix in rule.fixes:
        parts.append(f"### {FRAMEWORK_NAMES.get(fix.framework, fix.framework)}: {fix.title}")
        parts.append(f"```{fix.language}\n{fix.code.strip()}\n```")
    parts.append("## References")
    parts.append("\n".join(f"- [{title}]({url})" for title, url in rule.references))
    return "\n\n".join(parts) + "\n"


def bytes_evidence(label: str, num_bytes: float) -> Evidence:
    """Evidence "label: 1.2 GiB" carrying the number in bytes."""
    return Evidence(f"{label}: {format_bytes(num_bytes)}", float(num_bytes), "bytes")


def ratio_evidence(label: str, ratio: float) -> Evidence:
    """Evidence "label: 2.3x" carrying the ratio."""
    return Evidence(f"{label}: {ratio_text(ratio)}", round(ratio, 4), "ratio")


def ratio_text(ratio: float) -> str:
    """ "2.3x", or "11,337,322x" when decimals would only add noise."""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x"


def share_evidence(label: str, fraction: float) -> Evidence:
    """Evidence "label: 87%" carrying the fraction in [0, 1]."""
    return Evidence(f"{label}: {format_percent(fraction)}", round(fraction, 4), "ratio")


def count_evidence(label: str, count: float) -> Evidence:
    return Evidence(f"{label}: {count:g}", float(count), "count")


def seconds_evidence(label: str, seconds: float) -> Evidence:
    return Evidence(f"{label}: {format_duration(seconds)}", round(seconds, 3), "s")
