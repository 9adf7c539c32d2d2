"""Every example that can run on a CPU fails for a real memory reason, and memdoc names the
cause its README promises as the first finding."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.rules.base import Finding
from memdoc.rules.engine import diagnose
from memdoc.rules.registry import all_rules
from memdoc.trace.reader import load_trace
from tests.examples.scenarios import EXAMPLES, Scenario, all_scenarios, load_scenario

SCENARIOS = all_scenarios()
# The CPU variant everywhere, even on a machine with a GPU.
CPU_ONLY_ENV = {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
RUN_TIMEOUT_S = 240
_FRAMEWORK_MARKS = {
    "torch": pytest.mark.torch,
    "jax": pytest.mark.jax,
    "tensorflow": pytest.mark.tensorflow,
}


def _param(scenario: Scenario) -> object:
    marks = [_FRAMEWORK_MARKS[m] for m in scenario.needs if m in _FRAMEWORK_MARKS]
    missing = [m for m in scenario.needs if importlib.util.find_spec(m) is None]
    if missing:
        marks.append(pytest.mark.skip(reason=f"needs {', '.join(missing)}"))
    if "tensorflow" in scenario.needs:
        marks.append(pytest.mark.slow)  # importing TensorFlow alone takes seconds
    return pytest.param(scenario, id=scenario.name, marks=marks)


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CPU_ONLY_ENV}
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def _describe(findings: list[Finding]) -> str:
    return "; ".join(f"{f.rule} {f.confidence:.2f}: {f.summary}" for f in findings)


@pytest.mark.parametrize("scenario", [_param(s) for s in SCENARIOS if s.on_cpu])
def test_memdoc_names_the_examples_cause_first(scenario: Scenario, tmp_path: Path) -> None:
    trace_path = tmp_path / f"{scenario.name}.memdoc"
    command = [sys.executable, "-m", "memdoc", "run", "-q", "-o", str(trace_path)]
    result = _run([*command, str(scenario.script)], cwd=tmp_path)

    assert result.returncode != 0, f"the example did not fail:\n{result.stdout[-2000:]}"
    trace = load_trace(trace_path)
    assert trace.ending_oom() is not None, (
        f"no memory error recorded; the program said:\n{result.stderr[-3000:]}"
    )
    findings = diagnose(trace)
    assert findings, "memdoc found no cause"
    assert findings[0].rule == scenario.rule, _describe(findings)


@pytest.mark.parametrize("scenario", [_param(s) for s in SCENARIOS if not s.on_cpu])
def test_gpu_only_examples_exit_saying_they_need_one(scenario: Scenario, tmp_path: Path) -> None:
    result = _run([sys.executable, str(scenario.script)], cwd=tmp_path)

    assert result.returncode == 1
    assert re.search(r"needs a (CUDA )?GPU", result.stderr), result.stderr[-2000:]


@pytest.mark.parametrize("scenario", [pytest.param(s, id=s.name) for s in SCENARIOS])
def test_each_example_promises_a_rule_of_the_catalogue(scenario: Scenario) -> None:
    assert scenario.rule in {rule.slug for rule in all_rules()}


def test_the_index_lists_every_example_with_its_rule_and_cpu_support() -> None:
    index = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| \[(\w+)\]\(\1/\) \| `([a-z0-9-]+)` \| (yes|no) \|", index, re.MULTILINE)

    listed = {name: (rule, cpu == "yes") for name, rule, cpu in rows}
    declared = {s.name: (s.rule, s.on_cpu) for s in SCENARIOS}
    assert listed == declared


def test_a_readme_without_its_rule_line_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "broken_example"
    folder.mkdir()
    (folder / "README.md").write_text("# Broken\n\nRuns on CPU: yes\nNeeds: torch\n")
    (folder / "train.py").write_text("")

    with pytest.raises(ValueError, match="lacks a Rule:"):
        load_scenario(folder)
