"""Shared test helpers: run memdoc as a user would, in a real subprocess; the markers each
folder's tests get; and what lets the suite run in parallel (pytest-xdist, see README)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TESTS = Path(__file__).resolve().parent


def _keep_bytecode_of_subprocesses() -> None:
    """Most tests start memdoc in a fresh interpreter, as a user does. Where the environment
    says not to write bytecode (PYTHONDONTWRITEBYTECODE), each of those would compile every
    module it imports again; their bytecode goes to a private folder outside the tree
    instead, as an installed package's is kept. Set here, before pytest-xdist starts its
    workers, so that they and every process they start inherit it."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    folder = Path(tempfile.gettempdir()) / f"memdoc-tests-pycache-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return  # not this user's alone: bytecode read from it could be anyone's
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)


_keep_bytecode_of_subprocesses()

# Markers by folder or file, for choosing what to run: `-m "not slow"` is the everyday loop.
# `slow`: tests that run real programs for long (frameworks training, the examples, headroom
# searches, fault injection and fuzzing); the rest of a folder stays in the everyday loop.
_MARKS: dict[str, tuple[str, ...]] = {
    "tui/": ("tui",),
    "gpu/": ("gpu",),
    "cluster/": ("slow", "torch"),
    "examples/": ("slow",),
    "integrations/": ("slow",),
    "forecast/test_forecast_runs.py": ("slow",),
    "forecast/test_headroom_runs.py": ("slow",),
    "forecast/test_epoch_runs.py": ("slow", "tensorflow"),
    "forecast/test_headroom_settle.py": ("slow",),
    "run/test_agent_cost.py": ("slow",),
    "metrics/test_held_connections.py": ("slow",),
    "collectors/test_loops.py": ("slow",),
    "collectors/test_pytorch_cpu.py": ("torch",),
    "collectors/test_jax_cpu.py": ("jax",),
    "collectors/test_tensorflow_bfc.py": ("slow", "tensorflow"),
    "faults/test_bounded_input.py": ("slow",),
    "faults/test_damaged_values.py": ("slow",),
    "faults/test_explain_fuzz.py": ("slow",),
    "faults/test_full_disk.py": ("slow",),
    "faults/test_hostile_text.py": ("slow",),
    "faults/test_parent_failures.py": ("slow",),
    "faults/test_sigkill.py": ("slow",),
    "report/test_report_browser.py": ("browser",),
}
# Single tests that run a framework for long in a file that is otherwise quick.
_SLOW_TESTS = frozenset(
    {
        "run/test_caught_ooms.py::test_a_tensorflow_oom_the_program_survives_is_counted_once_and_not_a_failure",
        "rules/test_weight_copies.py::test_the_running_average_trains_under_the_cap_where_the_copies_ran_out",
    }
)
# Tests that time what they check (a program's pace beside another, a kill at an instant, a
# terminal driven with waits): one worker runs them one after another (xdist_group with
# --dist loadgroup), so that they never run beside each other.
_TIMED = frozenset(
    {
        "faults/test_parent_failures.py",
        "faults/test_sigkill.py",
        "forecast/test_forecast_runs.py",
        "run/test_channel.py",
        "tui/test_cost.py",
        "tui/test_terminal.py",
    }
)
# In files that run programs, a test or parameter named for a framework needs it.
_FRAMEWORK_WORDS = {
    "tensorflow": "tensorflow",
    "keras": "tensorflow",
    "tf": "tensorflow",
    "jax": "jax",
    "pytorch": "torch",
    "torch": "torch",
    "lightning": "torch",
    "transformers": "torch",
    "trainer": "torch",
}


def memdoc_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "memdoc", *args]


def run_memdoc(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    input: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    full_env = dict(os.environ)
    full_env.pop("MEMDOC_AGENT", None)
    if env:
        full_env.update(env)
    return subprocess.run(
        memdoc_cmd(*args), cwd=cwd, env=full_env, capture_output=True, timeout=timeout, input=input
    )


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core, and one more. A good part of the suite waits (on the
    real programs it runs under memdoc, on their sockets and their ends) rather than
    computes; measured on a 2-core machine, three workers ran the suite in 8 minutes, two
    in 11 (with the modules that share one slow run kept to one worker each)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        have = {mark.name for mark in item.iter_markers()}
        for name in sorted(_marks_of(item) - have):
            item.add_marker(name)
        where = _where(item)
        if where in _TIMED and "xdist_group" not in have:
            item.add_marker(pytest.mark.xdist_group("timed"))


def _where(item: pytest.Item) -> str | None:
    """The item's file, relative to tests/."""
    path = item.path.resolve()
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else None


def _marks_of(item: pytest.Item) -> set[str]:
    """The markers `item` gets from its folder, its file and its name."""
    where = _where(item)
    if where is None:
        return set()
    names: set[str] = set()
    for prefix, marks in _MARKS.items():
        if where == prefix or (prefix.endswith("/") and where.startswith(prefix)):
            names.update(marks)
    function = item.originalname if isinstance(item, pytest.Function) else item.name
    if f"{where}::{function}" in _SLOW_TESTS:
        names.add("slow")
    if "slow" in names:
        words = item.name.replace("[", "_").replace("-", "_").replace("]", "_").split("_")
        names.update(_FRAMEWORK_WORDS[word] for word in words if word in _FRAMEWORK_WORDS)
    return names
