"""Two runs' figures side by side, and the budget that says whether the new one may pass.

A budget is a share of the base figure ("5%") or bytes ("64 MiB"), for every figure or for
one ("peak_used=5%"). Growth per step is judged by what it adds over the new run: a leak
fails when growth times the steps exceeds the budget of the base run's peak, so "5%" means
the same thing for a peak and for a leak.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from memdoc.budget.figures import (
    FIGURE_ORDER,
    GROWTH_PER_STEP,
    HOST,
    PEAK_HELD,
    PEAK_STEP,
    PEAK_USED,
    PHASE_PREFIX,
    Figures,
    Place,
    is_bytes,
)
from memdoc.units import format_bytes, parse_size


@dataclass(frozen=True)
class Limit:
    """One budget: a share of the base figure, or bytes over it."""

    share: float | None = None
    bytes: float | None = None

    def allowance(self, base: float) -> float:
        return self.share * abs(base) if self.share is not None else float(self.bytes or 0.0)

    def words(self) -> str:
        if self.share is not None:
            return f"{self.share * 100:g}%"
        return format_bytes(int(self.bytes or 0))


# The host's RSS counts the pages of libraries mapped from disk as well as the program's
# own memory. Those pages differ between machines and builds of one library version (the
# same PyTorch program held 703 MiB on one 2-core machine and 780 MiB on another, while its
# own memory stayed within 5%), so a budget kept on RSS fails a branch for the machine it ran on.
HOST_HELD_NOTE = (
    "host: RSS grew beyond the budget, which is kept on the program's own memory (peak "
    "used), not on RSS: RSS counts library pages that differ between machines; name "
    "peak_held= to keep a budget on it"
)


@dataclass(frozen=True)
class Budget:
    """Limits per figure name; `default` for every figure not named."""

    default: Limit | None = None
    per_figure: dict[str, Limit] = field(default_factory=dict)

    def limit_for(self, figure: str, place: str = "") -> Limit | None:
        """The limit on one figure of one place. The bare budget is not kept on the host's
        RSS (see HOST_HELD_NOTE): only a budget that names peak_held is."""
        if figure in self.per_figure:
            return self.per_figure[figure]
        if figure.startswith(PHASE_PREFIX) and "phase_peak" in self.per_figure:
            return self.per_figure["phase_peak"]
        if figure == PEAK_STEP or (figure == PEAK_HELD and place == HOST):
            return None
        return self.default

    @property
    def empty(self) -> bool:
        return self.default is None and not self.per_figure


_LIMIT = re.compile(r"^\s*(?:(?P<figure>[a-z_.]+)\s*=\s*)?(?P<amount>.+?)\s*$")


def parse_budget(specs: Sequence[str]) -> Budget:
    """`["5%"]`, `["64MiB", "growth_per_step=0"]`, ...; ValueError with the reason."""
    default: Limit | None = None
    per_figure: dict[str, Limit] = {}
    for spec in specs:
        match = _LIMIT.match(spec)
        if match is None or not match["amount"]:
            raise ValueError(f"not a budget: {spec!r} (try 5%, 64MiB or peak_used=5%)")
        limit = parse_limit(match["amount"])
        figure = match["figure"]
        if figure is None:
            default = limit
        elif figure in FIGURE_ORDER or figure == "phase_peak" or figure.startswith(PHASE_PREFIX):
            if figure == PEAK_STEP:
                raise ValueError("peak_step is a step number: it takes no budget")
            per_figure[figure] = limit
        else:
            names = ", ".join([*FIGURE_ORDER, "phase_peak"])
            raise ValueError(f"no figure called {figure!r} (the figures: {names})")
    return Budget(default, per_figure)


def parse_limit(text: str) -> Limit:
    text = text.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1]) / 100
        except ValueError:
            raise ValueError(f"not a share: {text!r}") from None
        if not share >= 0 or share == float("inf"):
            raise ValueError(f"a budget must be zero or more: {text!r}")
        return Limit(share=share)
    amount = parse_size(text)
    if amount is None or amount < 0:
        raise ValueError(f"not a size or a share: {text!r} (try 5% or 64MiB)")
    return Limit(bytes=float(amount))


@dataclass(frozen=True)
class Row:
    """One figure of one place in both runs."""

    place: str
    place_label: str
    figure: str
    base: float | None
    new: float | None
    limit: Limit | None = None
    allowed: float | None = None  # how much more the new run may need, in the figure's unit
    over: bool = False
    why: str = ""  # for growth: what it adds over the run

    @property
    def change(self) -> float | None:
        if self.base is None or self.new is None:
            return None
        return self.new - self.base

    @property
    def change_share(self) -> float | None:
        change = self.change
        if change is None or not self.base:
            return None
        return change / abs(self.base)


@dataclass(frozen=True)
class Comparison:
    base: Figures
    new: Figures
    rows: tuple[Row, ...]
    appeared: tuple[str, ...]  # finding slugs only in the new run
    gone: tuple[str, ...]
    notes: tuple[str, ...] = ()  # what was not compared, and why, in one line each

    @property
    def over(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.over)


class NotComparable(ValueError):
    """Two runs that cannot be compared at all (different programs, nothing shared)."""


def compare(
    base: Figures, new: Figures, budget: Budget | None = None, *, any_program: bool = False
) -> Comparison:
    """The shared figures of two runs; over budget where the new one needs more than the
    budget allows. Different programs are refused unless `any_program`; different devices
    are compared only on what does not depend on the device (allocated bytes, the host)."""
    budget = budget or Budget()
    if not any_program and base.program and new.program and base.program != new.program:
        raise NotComparable(f"the two runs ran different programs ({base.program}, {new.program})")
    notes: list[str] = []
    rows: list[Row] = []
    for name in _shared_places(base, new, notes):
        base_place, new_place = base.places[name], new.places[name]
        same_device = base_place.device_name == new_place.device_name or name == HOST
        if not same_device:
            notes.append(
                f"{name}: {base_place.device_name or 'unknown'} in one run and "
                f"{new_place.device_name or 'unknown'} in the other: compared only on what "
                "tensors were allocated (the pool and the driver differ by device)"
            )
        for figure in _figure_names(base_place, new_place):
            if not same_device and figure != PEAK_USED:
                continue
            rows.append(_row(base_place, new_place, figure, budget, new.steps))
    notes.extend(_rss_beyond_the_bare_budget(rows, budget))
    return Comparison(
        base,
        new,
        tuple(rows),
        appeared=tuple(sorted({f.rule for f in new.findings} - {f.rule for f in base.findings})),
        gone=tuple(sorted({f.rule for f in base.findings} - {f.rule for f in new.findings})),
        notes=tuple(notes),
    )


def _rss_beyond_the_bare_budget(rows: Sequence[Row], budget: Budget) -> list[str]:
    """The note, where the host's RSS grew beyond a bare budget that is not kept on it."""
    if budget.default is None or PEAK_HELD in budget.per_figure:
        return []
    for row in rows:
        if row.place != HOST or row.figure != PEAK_HELD or row.change is None:
            continue
        if row.base is not None and row.change > budget.default.allowance(row.base):
            return [HOST_HELD_NOTE]
    return []


def _shared_places(base: Figures, new: Figures, notes: list[str]) -> list[str]:
    shared = [name for name in base.places if name in new.places]
    only = sorted(set(base.places) ^ set(new.places))
    if only:
        notes.append(f"not compared, in one run only: {', '.join(only)}")
    if not shared:
        raise NotComparable("the two runs share no device and no host figures")
    return shared


def _figure_names(base: Place, new: Place) -> list[str]:
    names = [f for f in FIGURE_ORDER if f in base.figures or f in new.figures]
    phases = sorted({f for f in (*base.figures, *new.figures) if f.startswith(PHASE_PREFIX)})
    return names + phases


def _row(base_place: Place, new_place: Place, figure: str, budget: Budget, steps: int) -> Row:
    limit = budget.limit_for(figure, base_place.name)
    row = Row(
        place=base_place.name,
        place_label=new_place.label,
        figure=figure,
        base=base_place.figures.get(figure),
        new=new_place.figures.get(figure),
        limit=limit,
    )
    if limit is None or not is_bytes(figure):
        return row
    if figure == GROWTH_PER_STEP:
        return _growth_row(row, base_place, limit, steps)
    if row.base is None or row.new is None:
        return row
    allowed = limit.allowance(row.base)
    return dataclasses.replace(row, allowed=allowed, over=row.new - row.base > allowed)


def _growth_row(row: Row, base_place: Place, limit: Limit, steps: int) -> Row:
    """Growth is over budget when what it adds over the new run's steps, beyond the base
    run's growth, exceeds the budget of the base run's peak (or the bytes given)."""
    if row.new is None or steps <= 0:
        return row
    base_rate = max(row.base or 0.0, 0.0)
    reference = base_place.figures.get(PEAK_USED) or base_place.figures.get(PEAK_HELD) or 0.0
    allowed_total = limit.allowance(reference) if limit.share is not None else limit.allowance(0)
    added = (row.new - base_rate) * steps
    return dataclasses.replace(
        row,
        allowed=allowed_total / steps,
        over=added > allowed_total,
        why=f"adds {format_bytes(max(added, 0.0))} over {steps:,} steps",
    )
