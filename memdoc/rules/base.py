"""The rule seams: `Rule`, `RunRule`, `Finding`, `Evidence`, `Fix`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from memdoc.trace.model import OomInfo
from memdoc.trace.reader import Run

if TYPE_CHECKING:
    from memdoc.rules.context import Facts


@dataclass(frozen=True)
class Evidence:
    """One fact behind a finding, as a number with its unit where it has one.

    `text` is what a person reads ("reserved but unallocated: 40.7 GiB, 3.4x the request");
    `value` and `unit` ("bytes", "s", "ratio", "count") let tools use the number.
    """

    text: str
    value: float | None = None
    unit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text}
        if self.value is not None:
            out["value"] = self.value
        if self.unit is not None:
            out["unit"] = self.unit
        return out


@dataclass(frozen=True)
class Fix:
    """A change to make, as code the user can paste, for one framework ("any" for all)."""

    framework: str
    title: str
    code: str
    language: str = "python"  # how to highlight `code`: "python" or "bash"
    gpu_only: bool = False  # a GPU setting (CUDA allocator, cache): no use on a CPU-only run

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "title": self.title,
            "code": self.code,
            "language": self.language,
        }


@dataclass(frozen=True)
class Finding:
    """A root cause the trace points at, how sure we are, why, and what to change."""

    rule: str  # slug, e.g. "fragmentation"
    code: str  # short code, e.g. "MD001"
    title: str
    confidence: float  # in [0, 1]
    summary: str  # one sentence for this run
    evidence: tuple[Evidence, ...] = ()
    fixes: tuple[Fix, ...] = ()
    to_confirm: str | None = None  # what to record to be sure, when the evidence is weak
    rank: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # What raised the confidence above its level's base, or capped it, in words.
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "code": self.code,
            "title": self.title,
            "confidence": round(self.confidence, 2),
            "summary": self.summary,
            "evidence": [e.to_dict() for e in self.evidence],
            "fixes": [f.to_dict() for f in self.fixes],
        }
        if self.reasons:
            out["confidence_reasons"] = list(self.reasons)
        if self.to_confirm:
            out["to_confirm"] = self.to_confirm
        if self.rank is not None:
            out["rank"] = self.rank
        return out


class Rule(Protocol):
    """One documented root cause. `check` works on a full trace and on a text-only one."""

    slug: str
    code: str
    title: str
    # Markdown with the fixed sections:
    # What it is / Why it happens / How to confirm / Fixes / References
    doc: str

    # True when the cause is a behaviour over time (growth across steps, a phase, a first
    # step): from an error text alone the engine lets it claim no more than TEXT_ONLY_CAP.
    needs_recording: bool

    def check(self, facts: Facts) -> Finding | None:
        """This cause's finding on the trace `facts` asks, or None where it is not seen."""
        ...

    def ruled_out_by(self, oom: OomInfo) -> bool:
        """True when the error's own figures rule this cause out (other processes cannot
        have filled a device this process held most of)."""
        ...

    def common_cause(
        self,
        facts: Facts,
        summary: str,
        evidence: Sequence[Evidence],
        *,
        to_confirm: str,
        frameworks: Sequence[str],
    ) -> Finding:
        """A weak finding of this cause, named for how often it ends real incidents, where
        an error's text alone cannot tell the cause."""
        ...


class RunRule(Protocol):
    """A rule over several traces of one run (ranks, nodes): cross-rank findings."""

    slug: str
    code: str
    title: str
    doc: str

    def check_run(self, run: Run) -> list[Finding]: ...
