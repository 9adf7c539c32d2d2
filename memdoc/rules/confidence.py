"""The one confidence scale: a finding's number and word follow from the signals it found."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Level(IntEnum):
    """What the strongest signal of a finding earns on its own."""

    WEAK = 1
    POSSIBLE = 2
    LIKELY = 3
    STRONG = 4

    @property
    def base(self) -> float:
        """The confidence of this level with no corroboration: 0.2, 0.4, 0.6, 0.8."""
        return round(LEVEL_STEP * self.value, 2)

    @property
    def word(self) -> str:
        return self.name.lower()


STRONG = Level.STRONG
LIKELY = Level.LIKELY
POSSIBLE = Level.POSSIBLE
WEAK = Level.WEAK

# Levels sit LEVEL_STEP apart. Each independent corroborating signal adds CORROBORATION,
# counted up to MAX_CORROBORATING, so that corroboration never lifts a finding into the
# next word: two weak signals are not a strong one.
LEVEL_STEP = 0.2
CORROBORATION = 0.05
MAX_CORROBORATING = 3
# The highest level a finding may claim when its cause is a behaviour over time (growth
# across steps, a phase, a first step) and all it has is one error text.
TEXT_ONLY_CAP = POSSIBLE


@dataclass(frozen=True)
class Signals:
    """The evidence a rule found: its strongest signal's level and the independent others.

    `corroborating` is a set of names, so one signal counted twice is still one signal.
    """

    level: Level
    corroborating: frozenset[str] = frozenset()

    @classmethod
    def of(cls, level: Level, **checks: bool) -> Signals:
        """`level` plus every named check that holds: `Signals.of(LIKELY, failed_in_eval=x)`."""
        return cls(level, frozenset(name for name, held in checks.items() if held))

    @property
    def confidence(self) -> float:
        extra = CORROBORATION * min(len(self.corroborating), MAX_CORROBORATING)
        return round(self.level.base + extra, 2)

    @property
    def word(self) -> str:
        return confidence_word(self.confidence)

    @property
    def reasons(self) -> tuple[str, ...]:
        """The corroborations, in words, in a stable order."""
        return tuple(reason_words(name) for name in sorted(self.corroborating))

    def at_most(self, level: Level) -> Signals:
        """The same signals, claiming no more than `level`."""
        return Signals(min(self.level, level), self.corroborating)

    def plus(self, **checks: bool) -> Signals:
        """These signals and every named check that holds."""
        return Signals(
            self.level, self.corroborating | Signals.of(self.level, **checks).corroborating
        )


# Corroborations whose names say too little on their own, in words; the others read as
# their names with spaces.
_REASON_WORDS = {
    "absurd": "a request beyond any device",
    "doubled": "memory doubled while loading",
    "failed_there": "the failure came there",
    "three_or_more": "three or more of them",
    "sizeable": "a sizeable request",
    "shape_known": "the tensor's shape is known",
    "first_step": "in the first step",
    "large_request": "a large request",
    "split_blocks": "split blocks in the pool",
    "outside_a_loops_evaluation": "outside a loop's own evaluation",
    "in_the_loops_evaluation": "in the loop's own evaluation",
}
# Said of a finding whose cause is a behaviour over time, from an error text alone.
CAPPED = "capped: "
TEXT_ONLY_REASON = CAPPED + "one error text cannot show a behaviour over time"


def confidence_line(reasons: tuple[str, ...]) -> str:
    """A finding's reasons as one line: what corroborated it, then what capped it."""
    raised = [r for r in reasons if not r.startswith(CAPPED)]
    caps = [r for r in reasons if r.startswith(CAPPED)]
    parts = [f"corroborated by: {'; '.join(raised)}"] if raised else []
    return " · ".join(parts + caps)


def reason_words(name: str) -> str:
    """A corroboration's name as a person reads it: `ended_in_failure` -> "ended in failure"."""
    return _REASON_WORDS.get(name, name.replace("_", " "))


def confidence_word(confidence: float) -> str:
    """How sure, in a word: the level whose band holds `confidence`."""
    for level in sorted(Level, reverse=True):
        if confidence >= level.base - 1e-9:
            return level.word
    return WEAK.word


def capped(confidence: float, level: Level) -> float:
    """`confidence`, lowered to `level` with no corroboration when it claims more."""
    return confidence if confidence_word(confidence) in _AT_OR_BELOW[level] else level.base


_AT_OR_BELOW = {top: {lv.word for lv in Level if lv <= top} for top in Level}
