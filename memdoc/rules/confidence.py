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

    def at_most(self, level: Level) -> Signals:
        """The same signals, claiming no more than `level`."""
        return Signals(min(self.level, level), self.corroborating)

    def plus(self, **checks: bool) -> Signals:
        """These signals and every named check that holds."""
        return Signals(
            self.level, self.corroborating | Signals.of(self.level, **checks).corroborating
        )


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
