"""compare() on runs recorded from real programs (tests/budget/programs, on the CPU): a leak
fails a 5% budget on its growth in each framework, 10% wider activations fail a 5% budget
on the peaks, and two runs of one program pass it."""

from __future__ import annotations

import pytest

from memdoc.budget.compare import compare, parse_budget
from memdoc.budget.figures import (
    GROWTH_PER_STEP,
    HOST,
    PEAK_HELD,
    PEAK_STEP,
    PEAK_USED,
    STEP_PEAK,
)
from tests.budget.runs import BASES, LEAKS, figures_of


@pytest.mark.parametrize("framework", sorted(LEAKS))
def test_a_leak_fails_a_five_percent_budget_on_its_growth(framework: str) -> None:
    base, leak = figures_of(BASES[framework]), figures_of(LEAKS[framework])

    comparison = compare(base, leak, parse_budget(["5%"]))

    growth = [r for r in comparison.over if r.figure == GROWTH_PER_STEP]
    assert [r.place for r in growth] == [HOST], comparison.rows
    assert growth[0].why.startswith("adds ") and f"over {leak.steps} steps" in growth[0].why
    assert "leak-across-steps" in comparison.appeared


@pytest.mark.parametrize("framework", sorted(LEAKS))
def test_a_leak_passes_a_budget_on_peaks_alone_that_allows_what_it_kept(framework: str) -> None:
    """Only the figures named are judged: a budget of 100% on the peak alone passes each
    leak (the programs keep some 120 MiB over 30 steps, in runs of 180 MiB and more)."""
    comparison = compare(
        figures_of(BASES[framework]), figures_of(LEAKS[framework]), parse_budget(["peak_used=100%"])
    )

    assert comparison.over == ()


def test_wider_activations_fail_a_five_percent_budget_on_the_peaks() -> None:
    comparison = compare(figures_of("torch-base"), figures_of("torch-wider"), parse_budget(["5%"]))

    over = {r.figure for r in comparison.over}
    assert {PEAK_USED, STEP_PEAK} <= over, comparison.rows
    assert GROWTH_PER_STEP not in over, "wider is not a leak"
    used = next(r for r in comparison.rows if r.figure == PEAK_USED)
    assert 0.05 < (used.change_share or 0) < 0.10, "10% wider activations: most of the peak"


def test_two_runs_of_one_program_pass_a_five_percent_budget() -> None:
    comparison = compare(
        figures_of("torch-base"), figures_of("torch-base-again"), parse_budget(["5%"])
    )

    assert comparison.over == ()
    assert (comparison.appeared, comparison.gone, comparison.notes) == ((), (), ())
    figures = {r.figure for r in comparison.rows}
    assert {PEAK_HELD, PEAK_USED, STEP_PEAK, GROWTH_PER_STEP, PEAK_STEP} <= figures


def test_the_recorded_runs_ended_and_counted_their_steps() -> None:
    for name in (*BASES.values(), *LEAKS.values(), "torch-wider", "torch-base-again"):
        figures = figures_of(name)
        assert figures.ended == "ok", name
        assert figures.steps >= 29, name
        assert figures.places[HOST].figures.get(PEAK_USED), name


def test_runs_of_different_frameworks_are_different_programs() -> None:
    from memdoc.budget.compare import NotComparable

    with pytest.raises(NotComparable):
        compare(figures_of("torch-base"), figures_of("jax-base"))
