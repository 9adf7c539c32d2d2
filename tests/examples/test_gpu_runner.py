"""`tests/gpu/run_all.sh` runs the planned scenarios, skips what cannot run, stops at its
time budget, and writes a summary that says pass only when the promised rule came first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples.scenarios import Scenario, all_scenarios
from tests.gpu.summarize import planned, skip_reason

RUN_ALL = Path(__file__).resolve().parent.parent / "gpu" / "run_all.sh"


def _run_all(outdir: Path, **env: str) -> tuple[int, dict[str, dict[str, object]]]:
    full_env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", **env}
    result = subprocess.run(
        ["bash", str(RUN_ALL), str(outdir)], env=full_env, capture_output=True, timeout=300
    )
    rows = json.loads((outdir / "summary.json").read_text())
    return result.returncode, {row["scenario"]: row for row in rows}


def _scenario(needs: tuple[str, ...]) -> Scenario:
    return Scenario("s", Path("s/train.py"), "host-oom", on_cpu=True, needs=needs)


def test_a_scenario_whose_framework_is_missing_is_skipped_with_its_name() -> None:
    def find_spec(module: str) -> object | None:
        return None if module == "tensorflow" else object()

    assert skip_reason(_scenario(("tensorflow", "torch")), find_spec) == "TensorFlow not installed"
    assert skip_reason(_scenario(("torch",)), find_spec) == ""


def test_the_plan_runs_gpu_only_scenarios_first_and_can_be_narrowed() -> None:
    plan = planned()
    first_cpu = next(i for i, s in enumerate(plan) if s.on_cpu)

    assert all(s.on_cpu for s in plan[first_cpu:])
    assert len(plan) == len(all_scenarios())
    assert [s.name for s in planned("jax_oom, tensorflow_oom")] == ["jax_oom", "tensorflow_oom"]


def test_scenarios_past_the_time_budget_are_skipped_not_run(tmp_path: Path) -> None:
    code, rows = _run_all(tmp_path, TOTAL_BUDGET_S="0", MEMDOC_EXAMPLES="jax_oom,tensorflow_oom")

    assert code == 0
    assert {row["result"] for row in rows.values()} == {"skipped"}
    assert "out of time" in str(rows["jax_oom"]["note"])
    assert not list(tmp_path.glob("*.memdoc"))


@pytest.mark.torch
def test_a_scenario_that_outlives_its_timeout_fails_as_timed_out(tmp_path: Path) -> None:
    code, rows = _run_all(
        tmp_path, SCENARIO_TIMEOUT_S="1", MEMDOC_EXAMPLES="pytorch_leak_across_steps"
    )

    assert code == 1
    assert rows["pytorch_leak_across_steps"]["result"] == "fail"
    assert "timed out" in str(rows["pytorch_leak_across_steps"]["note"])


@pytest.mark.torch
def test_the_summary_passes_the_promised_rule_and_fails_a_run_without_it(tmp_path: Path) -> None:
    names = "pytorch_leak_across_steps,pytorch_fragmentation"
    code, rows = _run_all(tmp_path, MEMDOC_EXAMPLES=names)

    leak, fragmentation = rows["pytorch_leak_across_steps"], rows["pytorch_fragmentation"]
    assert (leak["result"], leak["top"], leak["memory_error"]) == (
        "pass",
        "leak-across-steps",
        True,
    )
    # Without a GPU the fragmentation example exits at once: no memory error, no finding.
    assert (fragmentation["result"], fragmentation["memory_error"]) == ("fail", False)
    assert code == 1
    assert (
        "| pytorch_leak_across_steps | `leak-across-steps` |"
        in (tmp_path / "summary.md").read_text()
    )
    assert (tmp_path / "pytorch_leak_across_steps.memdoc").stat().st_size > 0
