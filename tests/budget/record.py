"""Record the budget fixtures from real programs: `memdoc run` each program of
tests/budget/programs on the CPU, then keep the trace with the paths of this checkout, its
virtual environment and the temporary folder it ran in taken out, so that a fixture reads
the same wherever it was recorded.

    python -m tests.budget.record            # every fixture in FIXTURES
    python -m tests.budget.record NAME ...   # some of them

Each fixture is tests/budget/fixtures/NAME.memdoc.gz. The programs' batch sizes and steps
keep each trace small (sampled at the default interval, at steps and at the end)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.rules.record import scrub

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
FIXTURES = HERE / "fixtures"

# name: (program, its arguments, its environment)
RECORDINGS: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {
    "torch-base": ("torch_train.py", ("4096",), {}),
    "torch-base-again": ("torch_train.py", ("4096",), {}),
    "torch-leak": ("torch_train.py", ("4096",), {"LEAK": "1"}),
    "torch-wider": ("torch_train.py", ("4096",), {"WIDER": "1"}),
    "jax-base": ("jax_train.py", ("256",), {}),
    "jax-leak": ("jax_train.py", ("256",), {"LEAK": "1"}),
    "keras-base": ("keras_fit.py", ("256",), {}),
    "keras-leak": ("keras_fit.py", ("256",), {"LEAK": "1"}),
}


def fixture_path(name: str) -> Path:
    return FIXTURES / f"{name}.memdoc.gz"


def memdoc_run(
    program: str, args: tuple[str, ...], env: dict[str, str], trace: Path, cwd: str
) -> int:
    """Run one program under `memdoc run -o TRACE`; its exit status."""
    done = subprocess.run(
        [sys.executable, "-m", "memdoc", "run", "-q", "-o", str(trace), str(PROGRAMS / program)]
        + list(args),
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
        cwd=cwd,
        check=False,
    )
    return done.returncode


def record(name: str) -> int:
    program, args, env = RECORDINGS[name]
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "run.memdoc"
        code = memdoc_run(program, args, env, trace, folder)
        text = scrub(trace.read_text(), cwd=folder, programs=PROGRAMS)
    # mtime=0: a re-recorded fixture differs only where the run did.
    fixture_path(name).write_bytes(gzip.compress(text.encode(), mtime=0))
    return code


if __name__ == "__main__":
    FIXTURES.mkdir(exist_ok=True)
    for wanted in sys.argv[1:] or list(RECORDINGS):
        print(f"{wanted}: program exited {record(wanted)}")
