"""Which batch size to probe next: grow until a size runs out, then bisect the bracket."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# A probe is at most this many times the largest size that fitted: evidence first.
MAX_GROWTH = 4
# Growing with no limit in sight (the fit finds none), each probe doubles the last that
# fitted; with a limit predicted at or below it, each probe is a quarter larger.
BLIND_GROWTH = 2.0
MIN_GROWTH = 1.25


@dataclass(frozen=True)
class Outcome:
    """One probed size: did it train, under the limit less the margin kept free?"""

    size: int
    fits: bool


@dataclass(frozen=True)
class Bracket:
    """The largest size that fitted below every size that did not, and the smallest that
    did not (ran out of memory, or went over the margin); either None while unknown."""

    fits: int | None
    too_big: int | None

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Bracket:
        # A size that ran out below one that trained (runs differ near the limit) lowers the
        # bracket: a size is counted as fitting only below every size that did not.
        too_big = min((o.size for o in outcomes if not o.fits), default=None)
        fitted = [o.size for o in outcomes if o.fits and (too_big is None or o.size < too_big)]
        return cls(max(fitted, default=None), too_big)

    def answer(self, outcomes: Sequence[Outcome], multiple_of: int) -> int | None:
        """The largest multiple of `multiple_of` that was probed and fitted, in the bracket."""
        ran = {o.size for o in outcomes if o.fits}
        if self.fits is None:
            return None
        candidates = [s for s in ran if s <= self.fits and s % multiple_of == 0]
        return max(candidates, default=None)


def next_size(
    outcomes: Sequence[Outcome],
    multiple_of: int,
    *,
    predicted: int | None,
    use_fit: bool = True,
) -> int | None:
    """The size to probe next, or None when the bracket is closed (the answer and the
    smallest size that did not fit are adjacent multiples) or nothing is left to learn.

    - Nothing fitted yet: half the smallest size that ran out.
    - Nothing ran out yet: grow toward `predicted` (the fit's size at the limit), at least a
      quarter (twice, with no prediction) above the largest size that fitted, at most
      MAX_GROWTH times it: a line through small sizes says little about large ones.
    - Both ends known: inside the bracket, at `predicted` where `use_fit` (clamped into the
      bracket), else at its middle; the caller alternates the two, so a fit that is off on
      one side costs at most twice the probes of plain bisection.
    """
    k = multiple_of
    probed = {o.size for o in outcomes}
    bracket = Bracket.of(outcomes)
    lo, hi = bracket.fits, bracket.too_big
    if lo is None:
        if hi is None:
            return None
        half = _down(hi // 2, k)
        return half if half >= 1 and half not in probed else None
    first = _down(lo, k) + k  # the first multiple above the largest size that fitted
    if hi is not None:
        last = _up(hi, k) - k  # the last multiple below the smallest size that did not
        if first > last:
            # Closed. Where the sizes probed were not multiples, run the answer itself.
            answer = _down(lo, k)
            fitted_multiple = bracket.answer(outcomes, k) == answer
            return answer if answer >= k and not fitted_multiple else None
        size = predicted if use_fit and predicted is not None else (lo + hi) // 2
        return _clamp(_down(size, k), first, last, probed)
    growth = MIN_GROWTH if predicted is not None else BLIND_GROWTH
    size = max(predicted or 0, math.ceil(growth * lo))
    size = min(size, MAX_GROWTH * lo)
    return _clamp(_down(size, k), first, max(first, _down(MAX_GROWTH * lo, k)), probed)


def _clamp(size: int, first: int, last: int, probed: set[int]) -> int | None:
    size = min(max(size, first), last)
    return None if size in probed else size


def _down(size: int, k: int) -> int:
    return size - size % k


def _up(size: int, k: int) -> int:
    return _down(size + k - 1, k)
