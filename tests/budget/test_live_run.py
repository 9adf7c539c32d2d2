"""End to end: `memdoc run` the PyTorch program now, and compare it with the run recorded
in tests/budget/fixtures, as a CI job compares a branch's run with main's baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.budget.record import RECORDINGS, memdoc_run
from tests.budget.runs import recorded
from tests.conftest import run_memdoc

pytestmark = [pytest.mark.slow, pytest.mark.torch]

# The recorded run's budget. Its host figures are the process's own memory: the program's
# tensors (about 60% of the peak) and what PyTorch and Python map when they start, which
# moves a little with the version installed and the machine (two runs here differ by 0.2%).
BUDGET = "5%"


def test_a_run_now_keeps_to_five_percent_of_the_recorded_one(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    program, args, env = RECORDINGS["torch-base"]
    trace = tmp_path / "now.memdoc"
    assert memdoc_run(program, args, env, trace, str(tmp_path)) == 0

    result = run_memdoc(
        "compare", str(recorded("torch-base")), str(trace), "--fail-over", BUDGET, "--json"
    )

    out = json.loads(result.stdout)
    assert result.returncode == 0, [r for r in out["rows"] if r["over"]]
    assert out["over_budget"] is False and out["appeared"] == []
    assert {r["figure"] for r in out["rows"]} >= {"peak_used", "step_peak", "growth_per_step"}
