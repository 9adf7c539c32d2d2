"""Steps counted once: a program that marks its own steps and also calls `optimizer.step()`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memdoc.trace import load_trace
from tests.conftest import run_memdoc

STEPS = 6

HEAD = """\
import torch
import memdoc

model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

BODY = """\
model(torch.randn(4, 8)).sum().backward()
optimizer.step()
optimizer.zero_grad()
"""


def _script(*, watch: bool, mark_first: bool) -> str:
    """A training loop that marks its own steps, before or after `optimizer.step()`."""
    marker = "w.step()\n" if watch else "memdoc.step()\n"
    body = marker + BODY if mark_first else BODY + marker
    loop = f"for i in range({STEPS}):\n" + textwrap.indent(body, "    ")
    if watch:
        loop = 'with memdoc.watch("run.memdoc", quiet=True) as w:\n' + textwrap.indent(loop, "    ")
    return HEAD + loop


@pytest.mark.parametrize(
    ("watch", "mark_first"),
    [
        pytest.param(False, False, id="run-memdoc.step-after-optimizer"),
        pytest.param(False, True, id="run-memdoc.step-before-optimizer"),
        pytest.param(True, False, id="watch-w.step-after-optimizer"),
    ],
)
def test_explicit_steps_win_over_the_optimizer_hook_and_each_step_counts_once(
    tmp_path: Path, watch: bool, mark_first: bool
) -> None:
    (tmp_path / "train.py").write_text(_script(watch=watch, mark_first=mark_first))
    if watch:
        done = subprocess.run(
            [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, timeout=120
        )
    else:
        done = run_memdoc("run", "-q", "-o", "run.memdoc", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    trace = load_trace(tmp_path / "run.memdoc")
    steps = trace.steps()
    assert len(steps) == STEPS
    assert [s.data["step"] for s in steps] == list(range(1, STEPS + 1))
    assert {s.data["source"] for s in steps} == {"user"}
