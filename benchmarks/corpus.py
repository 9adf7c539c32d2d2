"""`python -m benchmarks.corpus [--json] [--misses]`: how often `explain` names the real cause.

The labelled corpus (`tests/fixtures/corpus/`) holds real out-of-memory incidents from public
threads, each with the cause its thread settled on, and real errors that are not about memory.
Every item belongs to one half, `dev` or `held`, by a hash of its id alone, so the split never
depends on results: tune on `dev`, report `held`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO_DIR
from memdoc.rules.confidence import confidence_word
from memdoc.rules.engine import explain_text

CORPUS_DIR = REPO_DIR / "tests" / "fixtures" / "corpus"
INCIDENTS_PATH = CORPUS_DIR / "incidents.jsonl"
NON_MEMORY_PATH = CORPUS_DIR / "non_memory.jsonl"
SPLITS = ("dev", "held")
FRESH = "held-newest"
# Most sure first: a better-calibrated scale is right more often the higher the word.
CONFIDENCE_WORDS = ("strong", "likely", "possible", "weak")


def split_of(item_id: str) -> str:
    """`held` for one id in three (sha256 of the id, mod 3 == 0), `dev` for the rest."""
    digest = hashlib.sha256(item_id.encode("utf-8")).digest()
    return "held" if int.from_bytes(digest, "big") % 3 == 0 else "dev"


@dataclass(frozen=True)
class Incident:
    """A real out-of-memory error and the root cause its public thread settled on."""

    id: str
    framework: str
    source: str
    title: str
    error_text: str
    context: str
    root_cause: str
    also_right: tuple[str, ...]
    fix: str
    evidence: str
    split: str
    round: int


@dataclass(frozen=True)
class NonMemoryError:
    """A real error that mentions memory-ish words but is not about running out of memory."""

    id: str
    framework: str
    source: str
    error_text: str
    why_not_memory: str
    split: str
    round: int


def _records(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def load_incidents(path: Path = INCIDENTS_PATH) -> list[Incident]:
    return [
        Incident(**{**record, "also_right": tuple(record["also_right"])})
        for record in _records(path)
    ]


def load_non_memory(path: Path = NON_MEMORY_PATH) -> list[NonMemoryError]:
    return [NonMemoryError(**record) for record in _records(path)]


@dataclass(frozen=True)
class Verdict:
    """What `explain` said about one incident, against its label."""

    id: str
    split: str
    wanted: str
    ranked: tuple[str, ...]
    top_confidence: float | None
    recognised: bool

    @property
    def top1(self) -> bool:
        return bool(self.ranked) and self.ranked[0] == self.wanted

    def top3(self, also_right: Iterable[str]) -> bool:
        return bool({self.wanted, *also_right} & set(self.ranked[:3]))

    @property
    def top_word(self) -> str | None:
        return None if self.top_confidence is None else confidence_word(self.top_confidence)


def judge(incident: Incident) -> Verdict:
    result = explain_text(incident.error_text)
    return Verdict(
        id=incident.id,
        split=incident.split,
        wanted=incident.root_cause,
        ranked=tuple(f.rule for f in result.findings),
        top_confidence=result.findings[0].confidence if result.findings else None,
        recognised=result.oom is not None or bool(result.findings),
    )


def flags_memory(error: NonMemoryError) -> bool:
    """A false positive: the text was taken for a memory error (an OOM parsed, or a finding)."""
    result = explain_text(error.error_text)
    return result.oom is not None or bool(result.findings)


@dataclass(frozen=True)
class Calibration:
    """Top findings that got one confidence word, and how many of them named the root cause."""

    word: str
    count: int
    right: int

    @property
    def precision(self) -> float | None:
        return self.right / self.count if self.count else None


@dataclass
class HalfScore:
    """The agreement on one half of the corpus."""

    split: str
    incidents: int = 0
    top1: int = 0
    top3: int = 0
    recognised: int = 0
    negatives: int = 0
    false_positives: int = 0
    calibration: list[Calibration] = field(default_factory=list)
    # Not in the repr: a failing test must not show which held items were missed.
    misses: list[str] = field(default_factory=list, repr=False)
    false_positive_ids: list[str] = field(default_factory=list, repr=False)

    @property
    def top1_rate(self) -> float:
        return self.top1 / self.incidents if self.incidents else 0.0

    @property
    def top3_rate(self) -> float:
        return self.top3 / self.incidents if self.incidents else 0.0

    @property
    def recognised_rate(self) -> float:
        return self.recognised / self.incidents if self.incidents else 0.0

    @property
    def false_positive_rate(self) -> float:
        return self.false_positives / self.negatives if self.negatives else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            top1_rate=self.top1_rate,
            top3_rate=self.top3_rate,
            recognised_rate=self.recognised_rate,
            false_positive_rate=self.false_positive_rate,
        )
        return data


def score_half(
    split: str, incidents: Sequence[Incident], negatives: Sequence[NonMemoryError]
) -> HalfScore:
    half = HalfScore(split)
    words: dict[str, list[int]] = {word: [0, 0] for word in CONFIDENCE_WORDS}
    for incident in incidents:
        if incident.split != split:
            continue
        verdict = judge(incident)
        half.incidents += 1
        half.top1 += verdict.top1
        half.top3 += verdict.top3(incident.also_right)
        half.recognised += verdict.recognised
        if verdict.top_word is not None:
            words[verdict.top_word][0] += 1
            words[verdict.top_word][1] += verdict.top1
        if not verdict.top1:
            half.misses.append(
                f"{incident.id}: wanted {incident.root_cause}, got {verdict.ranked[:3]}"
            )
    for error in negatives:
        if error.split != split:
            continue
        half.negatives += 1
        if flags_memory(error):
            half.false_positives += 1
            half.false_positive_ids.append(error.id)
    half.calibration = [Calibration(word, *words[word]) for word in CONFIDENCE_WORDS]
    return half


def evaluate(
    incidents: Sequence[Incident] | None = None, negatives: Sequence[NonMemoryError] | None = None
) -> dict[str, HalfScore]:
    """Both halves of the corpus, scored with the current rules, and under `FRESH` the held
    items of the newest round alone: collected after the rules last changed, so the truest
    measure of how the rules do on texts nobody tuned them on."""
    incidents = load_incidents() if incidents is None else incidents
    negatives = load_non_memory() if negatives is None else negatives
    scores = {split: score_half(split, incidents, negatives) for split in SPLITS}
    newest = max((item.round for item in [*incidents, *negatives]), default=1)
    if newest > 1:
        scores[FRESH] = score_half(
            "held",
            [i for i in incidents if i.round == newest],
            [e for e in negatives if e.round == newest],
        )
        scores[FRESH].split = f"held, round {newest}"
    return scores


def _percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "-"


def render(scores: dict[str, HalfScore], *, misses: bool = False, held_misses: bool = False) -> str:
    halves = [scores[split] for split in (*SPLITS, FRESH) if split in scores]
    rows = [
        ("incidents", [str(h.incidents) for h in halves]),
        ("top-1", [_percent(h.top1, h.incidents) for h in halves]),
        ("top-3", [_percent(h.top3, h.incidents) for h in halves]),
        ("recognised", [_percent(h.recognised, h.incidents) for h in halves]),
        ("false positives", [_percent(h.false_positives, h.negatives) for h in halves]),
    ]
    for i, word in enumerate(CONFIDENCE_WORDS):
        cells = [_percent(h.calibration[i].right, h.calibration[i].count) for h in halves]
        rows.append((f"top finding '{word}': right", cells))
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':{width}}" + "".join(f"  {h.split:>16}" for h in halves)]
    lines += [f"{name:{width}}" + "".join(f"  {c:>16}" for c in cells) for name, cells in rows]
    shown = [
        h
        for h in halves[:2]
        if (misses and h.split == "dev") or (held_misses and h.split == "held")
    ]
    if shown:
        for half in shown:
            lines.append(f"\n{half.split}: not top-1")
            lines += [f"  {line}" for line in half.misses]
            lines += [f"  false positive: {i}" for i in half.false_positive_ids]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.corpus", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument(
        "--misses", action="store_true", help="list what was not top-1 on the dev half"
    )
    parser.add_argument(
        "--held-misses",
        action="store_true",
        help="list the held half's misses too: once seen, that half no longer measures "
        "generalisation, so look only when a round of rule changes is over",
    )
    args = parser.parse_args(argv)
    scores = evaluate()
    if args.json:
        if not args.held_misses:
            for name in ("held", FRESH):
                if name in scores:
                    scores[name].misses, scores[name].false_positive_ids = [], []
        print(json.dumps({s: h.to_dict() for s, h in scores.items()}, indent=2))
    else:
        print(render(scores, misses=args.misses, held_misses=args.held_misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
