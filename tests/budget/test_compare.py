"""parse_budget and compare() on figures made by hand: what a budget means, and the edges
(a figure one run did not measure, a base of 0, growth without steps, different devices)."""

from __future__ import annotations

import math

import pytest

from memdoc.budget.compare import Budget, Limit, NotComparable, compare, parse_budget
from memdoc.budget.figures import (
    GROWTH_PER_STEP,
    HOST,
    PEAK_HELD,
    PEAK_STEP,
    PEAK_USED,
    STEP_PEAK,
    Figures,
    Place,
)

MiB = 1 << 20


def figures(
    program: str = "train.py",
    *,
    steps: int = 100,
    host: dict[str, float | None] | None = None,
    gpu: dict[str, float | None] | None = None,
    gpu_name: str | None = "NVIDIA H100 80GB HBM3",
) -> Figures:
    places = {HOST: Place(HOST, "host", None, dict(host or {}))}
    if gpu is not None:
        places["gpu0"] = Place("gpu0", f"GPU 0 ({gpu_name})", gpu_name, dict(gpu))
    return Figures(program, (program,), ("pytorch",), steps, places)


def row_of(comparison, place: str, figure: str):  # type: ignore[no-untyped-def]
    (row,) = [r for r in comparison.rows if r.place == place and r.figure == figure]
    return row


# -- parse_budget --------------------------------------------------------------------------


def test_a_share_or_bytes_without_a_name_is_every_figures_budget() -> None:
    assert parse_budget(["5%"]) == Budget(Limit(share=0.05))
    assert parse_budget(["64MiB"]) == Budget(Limit(bytes=64 * MiB))
    assert parse_budget(["64 MiB"]).default == Limit(bytes=64 * MiB)


def test_a_named_figure_gets_its_own_limit_beside_the_default() -> None:
    budget = parse_budget(["5%", "growth_per_step=0", "phase_peak.eval=1GiB"])

    assert budget.limit_for(PEAK_USED) == Limit(share=0.05)
    assert budget.limit_for(GROWTH_PER_STEP) == Limit(bytes=0)
    assert budget.limit_for("phase_peak.eval") == Limit(bytes=1 << 30)
    assert budget.limit_for(PEAK_STEP) is None, "a step number takes no budget"


def test_phase_peak_covers_every_phase() -> None:
    budget = parse_budget(["phase_peak=10%"])

    assert budget.limit_for("phase_peak.train") == Limit(share=0.1)
    assert budget.limit_for(PEAK_USED) is None


def test_no_spec_is_an_empty_budget() -> None:
    assert parse_budget([]).empty
    assert not parse_budget(["peak_used=5%"]).empty


@pytest.mark.parametrize(
    "spec",
    ["", "5x", "-5%", "nan%", "inf%", "five%", "peak_step=5%", "bogus=5%", "=5%", "1e400"],
)
def test_a_bad_spec_is_refused_with_its_reason(spec: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        parse_budget([spec])


# -- compare -------------------------------------------------------------------------------


def test_a_peak_over_its_share_is_over_and_one_within_it_is_not() -> None:
    base = figures(host={PEAK_USED: 1000 * MiB, PEAK_HELD: 1000 * MiB})
    new = figures(host={PEAK_USED: 1060 * MiB, PEAK_HELD: 1040 * MiB})

    comparison = compare(base, new, parse_budget(["5%"]))

    used, held = row_of(comparison, HOST, PEAK_USED), row_of(comparison, HOST, PEAK_HELD)
    assert used.over and used.change == 60 * MiB and used.change_share == pytest.approx(0.06)
    assert used.allowed == pytest.approx(50 * MiB)
    assert not held.over
    assert comparison.over == (used,)


def test_a_bare_budget_is_kept_on_the_hosts_own_memory_not_on_rss() -> None:
    # Recorded: the same PyTorch program held 703 MiB resident on one CI machine and 780 MiB
    # on another (library pages), its own memory within 5%.
    base = figures(host={PEAK_USED: 612 * MiB, PEAK_HELD: 703 * MiB})
    new = figures(host={PEAK_USED: 620 * MiB, PEAK_HELD: 780 * MiB})

    bare = compare(base, new, parse_budget(["5%"]))
    named = compare(base, new, parse_budget(["5%", "peak_held=5%"]))

    held = row_of(bare, HOST, PEAK_HELD)
    assert held.limit is None and not held.over and held.change == 77 * MiB
    assert bare.over == () and any("RSS" in note for note in bare.notes)
    assert row_of(named, HOST, PEAK_HELD).over, "a budget that names peak_held keeps it"
    assert not any("RSS" in note for note in named.notes)


def test_a_bare_budget_still_holds_a_gpus_pool() -> None:
    base = figures(gpu={PEAK_USED: 10 << 30, PEAK_HELD: 12 << 30})
    new = figures(gpu={PEAK_USED: 10 << 30, PEAK_HELD: 14 << 30})

    assert row_of(compare(base, new, parse_budget(["5%"])), "gpu0", PEAK_HELD).over


def test_bytes_allow_the_same_amount_whatever_the_base() -> None:
    base = figures(host={PEAK_USED: 100 * MiB})
    new = figures(host={PEAK_USED: 170 * MiB})

    assert row_of(compare(base, new, parse_budget(["64MiB"])), HOST, PEAK_USED).over
    assert not row_of(compare(base, new, parse_budget(["80MiB"])), HOST, PEAK_USED).over


def test_needing_less_is_never_over() -> None:
    base = figures(host={PEAK_USED: 100 * MiB})
    new = figures(host={PEAK_USED: 10 * MiB})

    row = row_of(compare(base, new, parse_budget(["0%"])), HOST, PEAK_USED)

    assert not row.over and row.change == -90 * MiB


def test_a_figure_one_run_did_not_measure_is_shown_but_not_judged() -> None:
    base = figures(host={PEAK_USED: 100 * MiB, STEP_PEAK: None})
    new = figures(host={PEAK_USED: 100 * MiB, STEP_PEAK: 500 * MiB, PEAK_HELD: 900 * MiB})

    comparison = compare(base, new, parse_budget(["5%"]))

    for figure in (STEP_PEAK, PEAK_HELD):
        row = row_of(comparison, HOST, figure)
        assert (row.base, row.change, row.change_share, row.allowed) == (None, None, None, None)
        assert not row.over
    assert not comparison.over


def test_a_base_of_zero_has_no_share_and_a_share_allows_it_nothing() -> None:
    base = figures(host={PEAK_USED: 0.0})
    new = figures(host={PEAK_USED: 1 * MiB})

    row = row_of(compare(base, new, parse_budget(["50%"])), HOST, PEAK_USED)

    assert row.change == MiB and row.change_share is None
    assert row.allowed == 0 and row.over
    same = row_of(
        compare(base, figures(host={PEAK_USED: 0.0}), parse_budget(["5%"])), HOST, PEAK_USED
    )
    assert not same.over


def test_growth_is_judged_by_what_it_adds_over_the_new_runs_steps() -> None:
    base = figures(steps=100, host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 0.0})
    small = figures(steps=100, host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 0.4 * MiB})
    large = figures(steps=100, host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 0.6 * MiB})
    budget = parse_budget(["5%"])  # 50 MiB over 100 steps

    kept = row_of(compare(base, small, budget), HOST, GROWTH_PER_STEP)
    leak = row_of(compare(base, large, budget), HOST, GROWTH_PER_STEP)

    assert not kept.over and kept.why == "adds 40.0 MiB over 100 steps"
    assert leak.over and leak.why == "adds 60.0 MiB over 100 steps"
    assert leak.allowed == pytest.approx(0.5 * MiB), "per step: 50 MiB over 100 steps"


def test_growth_the_base_already_had_is_not_counted_again() -> None:
    base = figures(host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 1 * MiB})
    new = figures(host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 1.2 * MiB})

    row = row_of(compare(base, new, parse_budget(["5%"])), HOST, GROWTH_PER_STEP)

    assert not row.over and row.why == "adds 20.0 MiB over 100 steps"


def test_growth_budget_zero_fails_any_growth_beyond_the_base() -> None:
    base = figures(host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 0.0})
    new = figures(host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 4096.0})

    row = row_of(compare(base, new, parse_budget(["growth_per_step=0"])), HOST, GROWTH_PER_STEP)

    assert row.over and row.allowed == 0


def test_growth_with_no_steps_or_not_measured_is_not_judged() -> None:
    base = figures(host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 0.0})
    no_steps = figures(steps=0, host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: 8 * MiB})
    unmeasured = figures(host={PEAK_USED: 1000 * MiB, GROWTH_PER_STEP: None})

    for new in (no_steps, unmeasured):
        row = row_of(compare(base, new, parse_budget(["0%"])), HOST, GROWTH_PER_STEP)
        assert not row.over and row.allowed is None and row.why == ""


def test_the_step_of_the_peak_is_shown_never_judged() -> None:
    base = figures(host={PEAK_STEP: 3.0})
    new = figures(host={PEAK_STEP: 90.0})

    row = row_of(compare(base, new, parse_budget(["0%"])), HOST, PEAK_STEP)

    assert row.change == 87 and not row.over and row.allowed is None


def test_without_a_budget_nothing_is_over() -> None:
    base = figures(host={PEAK_USED: 1 * MiB})
    new = figures(host={PEAK_USED: 1000 * MiB})

    assert compare(base, new).over == ()
    assert compare(base, new, Budget()).over == ()


def test_different_programs_are_refused_unless_asked() -> None:
    base = figures("train.py", host={PEAK_USED: MiB})
    new = figures("eval.py", host={PEAK_USED: MiB})

    with pytest.raises(NotComparable, match="different programs"):
        compare(base, new)
    assert compare(base, new, any_program=True).rows


def test_runs_that_share_no_place_are_refused() -> None:
    base = Figures("train.py", (), (), 1, {"gpu0": Place("gpu0", "GPU 0", "A100", {})})
    new = Figures("train.py", (), (), 1, {"gpu1": Place("gpu1", "GPU 1", "A100", {})})

    with pytest.raises(NotComparable, match="share no device"):
        compare(base, new, any_program=True)


def test_a_place_in_one_run_only_is_a_note() -> None:
    base = figures(host={PEAK_USED: MiB}, gpu={PEAK_USED: MiB})
    new = figures(host={PEAK_USED: MiB})

    comparison = compare(base, new)

    assert comparison.notes == ("not compared, in one run only: gpu0",)
    assert {r.place for r in comparison.rows} == {HOST}


def test_different_gpus_are_compared_on_allocated_bytes_only_with_a_note() -> None:
    base = figures(host={}, gpu={PEAK_USED: 10 * MiB, PEAK_HELD: 20 * MiB}, gpu_name="A100")
    new = figures(host={}, gpu={PEAK_USED: 10 * MiB, PEAK_HELD: 40 * MiB}, gpu_name="H100")

    comparison = compare(base, new, parse_budget(["5%"]))

    assert [r.figure for r in comparison.rows if r.place == "gpu0"] == [PEAK_USED]
    assert any("A100" in n and "H100" in n for n in comparison.notes)
    assert not comparison.over


def test_findings_that_appeared_and_went_away_are_named_by_slug() -> None:
    from memdoc.budget.figures import FoundCause

    base = figures(host={PEAK_USED: MiB})
    base = Figures(**{**base.__dict__, "findings": (FoundCause("fragmentation", "F", 0.5),)})
    new = figures(host={PEAK_USED: MiB})
    new = Figures(**{**new.__dict__, "findings": (FoundCause("leak-across-steps", "L", 0.9),)})

    comparison = compare(base, new)

    assert comparison.appeared == ("leak-across-steps",)
    assert comparison.gone == ("fragmentation",)


def test_figures_survive_the_baseline_format() -> None:
    original = figures(host={PEAK_USED: 1000.0 * MiB, GROWTH_PER_STEP: -0.25, STEP_PEAK: None})

    again = Figures.from_dict(original.to_dict())

    assert again.places[HOST].figures[PEAK_USED] == 1000 * MiB
    assert again.places[HOST].figures[STEP_PEAK] is None
    assert math.isclose(again.places[HOST].figures[GROWTH_PER_STEP] or 0, -0.25)
    assert (again.program, again.steps) == (original.program, original.steps)


@pytest.mark.parametrize("data", [{}, {"memdoc_baseline": 2, "places": {}}, {"memdoc_baseline": 1}])
def test_a_file_that_is_not_a_baseline_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Figures.from_dict(data)
