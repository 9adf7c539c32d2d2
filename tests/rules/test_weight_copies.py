"""A leak of whole copies of the model's weights is named as such, with a running average
as the fix; the fix works under the same cap on the real programs.

Fixtures: real runs of tests/rules/programs/torch_weight_snapshots.py and
keras_weight_snapshots.py (a copy of 8 MiB of weights kept after every step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.rules.causes.leak_across_steps import weight_copies
from memdoc.rules.context import Facts
from memdoc.rules.engine import diagnose
from memdoc.trace import Trace, load_trace
from memdoc.units import MiB
from tests.rules.fixture_cases import RULE_FIXTURES
from tests.rules.recorder import Recorder

PROGRAMS = Path(__file__).resolve().parent / "programs"
FOLDER = RULE_FIXTURES / "leak-across-steps"


@pytest.mark.parametrize(
    ("fixture", "fix_words"),
    [
        ("hit-torch-weight-snapshots.memdoc", "AveragedModel"),
        ("hit-keras-weight-snapshots.memdoc", "use_ema=True"),
    ],
)
def test_a_copy_of_the_weights_kept_each_step_is_named_and_averaged_in_place(
    fixture: str, fix_words: str
) -> None:
    leak = next(f for f in diagnose(load_trace(FOLDER / fixture)) if f.rule == "leak-across-steps")
    assert "about one copy of the model's weights (8.0 MiB) a step" in leak.summary
    assert fix_words in leak.fixes[0].code


def test_growth_that_is_not_a_whole_number_of_copies_says_nothing_of_weights(
    tmp_path: Path,
) -> None:
    trace = _with_model(tmp_path, 8 * MiB)
    assert weight_copies(Facts(trace), 8.3 * MiB) == (1, 8 * MiB)
    assert weight_copies(Facts(trace), 16.5 * MiB) == (2, 8 * MiB)
    assert weight_copies(Facts(trace), 12 * MiB) is None  # one and a half models: something else
    assert weight_copies(Facts(trace), 3 * MiB) is None  # less than a model
    assert weight_copies(Facts(trace), 80 * MiB) is None  # ten models a step: not a snapshot
    assert weight_copies(Facts(_with_model(tmp_path, 0.25 * MiB)), 0.25 * MiB) is None  # too small
    # The leak beside a mapped dataset (3 MiB a step, a 64 KiB model) says nothing of them.
    mapped = load_trace(FOLDER / "hit-leak-beside-mapped-reads.memdoc")
    leak = next(f for f in diagnose(mapped) if f.rule == "leak-across-steps")
    assert "weights" not in leak.summary


# The Keras program's fix (FIX=ema) trains all its steps under the same cap too; it is run
# by hand, not here: TensorFlow's start costs 20 s of the suite for the same check.
@pytest.mark.parametrize("program", ["torch_weight_snapshots.py"])
def test_the_running_average_trains_under_the_cap_where_the_copies_ran_out(program: str) -> None:
    def run(fix: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(PROGRAMS / program)],
            env={**os.environ, "FIX": fix},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    copies, average = run("none"), run("ema")
    assert copies.returncode != 0 and "allocate" in copies.stderr
    assert average.returncode == 0 and "trained" in average.stdout, average.stderr[-1000:]


def _with_model(tmp_path: Path, param_bytes: float) -> Trace:
    path = tmp_path / f"model-{param_bytes}.memdoc"
    rec = Recorder(path)
    rec.event(1.0, "model_state", framework="pytorch", param_bytes=param_bytes)
    rec.end(2.0, exit_code=0)
    return load_trace(path)
