"""The headroom search against a fake program: it brackets the truth and answers a size that
ran, grows geometrically until a size runs out, and says "at least" when nothing did."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from memdoc.cli import headroom as cli
from memdoc.cli.headroom import as_json, text_lines
from memdoc.forecast.bracket import MAX_GROWTH, Bracket, Outcome, next_size
from memdoc.forecast.headroom import PeakReading
from memdoc.run.headroom import DEFAULT_REFINE, DEFAULT_STEPS, Probe, crash_signal, search_sizes

MiB = float(1 << 20)
LIMIT = 1000 * MiB


def program(
    fixed: float,
    per_size: float,
    *,
    limit: float = LIMIT,
    peak: Callable[[int], float] | None = None,
) -> tuple[Callable[[int], Probe], list[int]]:
    """A fake probe: peak = fixed + per_size × size (or `peak(size)`); over the limit runs out.
    Returns it with the list of sizes it was asked for."""
    asked: list[int] = []

    def run(size: int) -> Probe:
        asked.append(size)
        bytes_ = peak(size) if peak else fixed + per_size * size
        if bytes_ > limit:
            return Probe(size, 1, 1, True, None, None)
        reading = PeakReading(bytes_, limit, "address-space cap (RLIMIT_AS)", "host.vms")
        return Probe(size, 0, 8, False, reading, None, settled=True)

    return run, asked


@pytest.mark.parametrize(
    ("fixed", "per_size", "multiple_of", "truth"),
    [
        pytest.param(600 * MiB, 4.5 * MiB, 8, 88, id="linear-k8"),
        pytest.param(100 * MiB, 1 * MiB, 1, 900, id="linear-k1-far"),
        pytest.param(900 * MiB, 3 * MiB, 4, 32, id="fixed-dominates"),
    ],
)
def test_the_answer_trains_and_the_next_multiple_up_runs_out(
    fixed: float, per_size: float, multiple_of: int, truth: int
) -> None:
    run, asked = program(fixed, per_size)
    result = search_sizes(run, [8, 16, 32], 0.0, multiple_of, refine=12)
    assert result.largest_size == truth
    assert result.too_big == truth + multiple_of
    assert not result.at_least and result.measured
    assert truth in asked and truth + multiple_of in asked


def test_a_line_that_underestimates_large_sizes_is_bisected_to_the_truth() -> None:
    # GIVEN memory that grows faster at large sizes than the small probes show (the fit says
    # about 225, the truth is 96)
    def peak(size: int) -> float:
        return 100 * MiB + 4 * MiB * size + (0.05 * MiB * size**2 if size > 40 else 0.0)

    run, _ = program(0, 0, peak=peak)
    result = search_sizes(run, [8, 16, 32], 0.0, 8, refine=10)
    # THEN the answer is measured, never the line's
    assert result.largest_size == 96
    assert result.too_big == 104


def test_every_probe_training_answers_at_least_the_largest() -> None:
    # Peaks that do not rise with the size: the fit finds no limit.
    run, asked = program(0, 0, peak=lambda size: 500 * MiB)
    result = search_sizes(run, [8, 16, 32], 0.05, 1, refine=3)
    assert result.at_least
    assert result.largest_size == max(asked) == 256  # doubled from 32: 64, 128, 256
    assert result.too_big is None


def test_probes_grow_geometrically_and_never_past_max_growth() -> None:
    run, asked = program(10 * MiB, 0.01 * MiB)
    search_sizes(run, [1, 2], 0.0, 1, refine=4)
    for i in range(2, len(asked)):
        assert asked[i] <= MAX_GROWTH * max(asked[:i])
        assert asked[i] > max(asked[:i])


def test_something_trained_is_never_nothing_fits() -> None:
    # The user's case: three sizes trained, their peaks flat and near the usable limit.
    run, _ = program(0, 0, peak=lambda size: 0.96 * LIMIT if size <= 64 else 2 * LIMIT)
    result = search_sizes(run, [8, 16, 32], 0.0, 1, refine=8)
    assert result.largest_size == 64 and result.too_big == 65


def test_nothing_fits_only_when_no_probe_trained() -> None:
    run, asked = program(1100 * MiB, 1 * MiB)
    result = search_sizes(run, [8, 16, 32], 0.0, 1, refine=4)
    assert result.largest_size is None and result.too_big == 1
    assert asked == [8, 4, 2, 1]  # no size above a size that ran out; halving below it


def test_the_margin_makes_a_size_that_trained_too_big() -> None:
    run, _ = program(500 * MiB, 5 * MiB)  # 90 trains at 950 MiB, over 95% of the limit
    result = search_sizes(run, [8, 16, 32], 0.05, 1, refine=12)
    assert result.largest_size == 90 and result.too_big == 91


def test_the_bracket_counts_a_size_only_below_every_size_that_ran_out() -> None:
    outcomes = [Outcome(64, True), Outcome(80, False), Outcome(88, True), Outcome(96, False)]
    assert Bracket.of(outcomes) == Bracket(64, 80)


@pytest.mark.parametrize(
    ("outcomes", "predicted", "use_fit", "expected"),
    [
        pytest.param([(32, True), (96, False)], None, True, 64, id="middle"),
        pytest.param([(32, True), (96, False)], 88, True, 88, id="at-the-fit"),
        pytest.param([(32, True), (96, False)], 200, True, 88, id="fit-clamped"),
        pytest.param([(32, True), (96, False)], 88, False, 64, id="middle-in-turn"),
        pytest.param([(88, True), (96, False)], 90, True, None, id="adjacent"),
        pytest.param([(32, True)], 40, True, 40, id="grow-a-quarter"),
        pytest.param([(32, True)], 100, True, 96, id="grow-to-fit"),
        pytest.param([(32, True)], 1000, True, 128, id="grow-at-most-4x"),
        pytest.param([(32, True)], None, True, 64, id="grow-blind-doubles"),
        pytest.param([(32, False)], None, True, 16, id="halve"),
    ],
)
def test_the_next_size(
    outcomes: list[tuple[int, bool]], predicted: int | None, use_fit: bool, expected: int | None
) -> None:
    said = next_size([Outcome(s, f) for s, f in outcomes], 8, predicted=predicted, use_fit=use_fit)
    assert said == expected


def test_the_answer_says_its_bracket_in_text_and_json() -> None:
    run, _ = program(600 * MiB, 4.5 * MiB)
    result = search_sizes(run, [8, 16, 32], 0.0, 8, refine=12)
    text = "\n".join(text_lines(result))
    assert "largest size that fits: 88 (measured: trains at 88, runs out at 96;" in text
    assert "nothing fits" not in text
    said = as_json(result)
    assert (said["largest_size"], said["too_big"], said["at_least"]) == (88, 96, False)


def test_at_least_is_said_in_text_and_json() -> None:
    run, _ = program(0, 0, peak=lambda size: 500 * MiB)
    result = search_sizes(run, [8, 16, 32], 0.05, 1, refine=3)
    text = "\n".join(text_lines(result))
    assert "largest size that fits: at least 256 (every probe trained" in text
    assert "it finds no limit" in text
    said = as_json(result)
    assert (said["largest_size"], said["too_big"], said["at_least"]) == (256, None, True)


def test_the_command_lines_defaults_are_the_searchs() -> None:
    assert (cli.DEFAULT_STEPS, cli.DEFAULT_REFINE) == (DEFAULT_STEPS, DEFAULT_REFINE)


@pytest.mark.parametrize(
    ("status", "signum"),
    [
        pytest.param(-11, 11, id="killed"),
        pytest.param(134, 6, id="mirrored-abort"),
        pytest.param(1, None, id="exit-1"),
        pytest.param(0, None, id="clean"),
    ],
)
def test_the_signal_a_probe_died_of(status: int, signum: int | None) -> None:
    assert crash_signal(status) == signum


def test_a_crash_above_a_size_that_trained_bounds_the_answer() -> None:
    trained, _ = program(600 * MiB, 4.5 * MiB)

    def run(size: int) -> Probe:
        done = trained(size)
        return dataclasses.replace(done, status=-11, oom=False, crashed=True) if done.oom else done

    result = search_sizes(run, [8, 16, 32], 0.0, 8, refine=12)
    assert (result.largest_size, result.too_big) == (88, 96)
    assert "crashes at 96" in "\n".join(text_lines(result))
