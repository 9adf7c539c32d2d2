"""The recorded runs the budget tests compare (tests/budget/record.py wrote them), and
their figures, read once per test process."""

from __future__ import annotations

import functools
from pathlib import Path

from memdoc.budget.figures import Figures, run_figures
from memdoc.report.inputs import load_inputs
from memdoc.report.overview import ending_of
from memdoc.rules.engine import diagnose_run
from tests.budget.record import fixture_path

# Each framework's program, run plainly and keeping something every step.
LEAKS = {"torch": "torch-leak", "jax": "jax-leak", "keras": "keras-leak"}
BASES = {"torch": "torch-base", "jax": "jax-base", "keras": "keras-base"}


def recorded(name: str) -> Path:
    path = fixture_path(name)
    assert path.is_file(), f"{path} is missing: python -m tests.budget.record {name}"
    return path


@functools.cache
def figures_of(name: str) -> Figures:
    """The figures of one recorded run, as `memdoc compare` reads them from its trace."""
    path = recorded(name)
    run = load_inputs([path])
    return run_figures(
        run.traces, diagnose_run(run), ended=ending_of(run.primary).kind, source=str(path)
    )
