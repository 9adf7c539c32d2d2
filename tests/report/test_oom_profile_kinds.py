"""A JAX memory profile saved at an OOM is read as pprof, never offered to the pickle reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.importers import JAX_MEMORY_PROFILE, detect
from memdoc.report.allocations import chosen_snapshot, load_allocations
from memdoc.trace import Event, EventKind, ExitInfo, TraceWriter, load_trace
from tests.report.traces import PID, T0, header

_SAVE_PROFILE = """
import sys
import jax.numpy as jnp
import jax

x = jnp.ones((256, 256), dtype=jnp.float32)
with open(sys.argv[1], "wb") as out:
    out.write(jax.profiler.device_memory_profile())
"""


@pytest.fixture(scope="module")
def profile_beside_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace whose OOM saved a real JAX device memory profile beside it."""
    folder = tmp_path_factory.mktemp("jax-oom")
    program = folder / "save.py"
    program.write_text(_SAVE_PROFILE)
    profile = folder / "memdoc-jax-memory-1.prof"
    subprocess.run(
        [sys.executable, str(program), str(profile)],
        check=True,
        timeout=120,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    trace = folder / "run.memdoc"
    writer = TraceWriter(trace, header(("train.py",)))
    data = {"path": profile.name, "reason": "oom", "framework": "jax", "format": "pprof"}
    writer.event(Event(T0 + 1.0, EventKind.SNAPSHOT, PID, data))
    writer.close(ExitInfo(T0 + 2.0, exit_code=1))
    return trace


def test_the_saved_profile_is_detected_as_a_jax_memory_profile(
    profile_beside_trace: Path,
) -> None:
    assert detect(profile_beside_trace.parent / "memdoc-jax-memory-1.prof") == JAX_MEMORY_PROFILE


def test_the_report_does_not_read_a_jax_profile_as_a_pytorch_snapshot(
    profile_beside_trace: Path,
) -> None:
    trace = load_trace(profile_beside_trace)
    warnings: list[str] = []

    allocations = load_allocations(trace, warnings)

    assert chosen_snapshot(trace) is None
    assert allocations is None and warnings == []


def test_a_profile_named_by_an_older_trace_without_its_format_is_also_left_out(
    profile_beside_trace: Path, tmp_path: Path
) -> None:
    trace_path = tmp_path / "old.memdoc"
    profile = profile_beside_trace.parent / "memdoc-jax-memory-1.prof"
    (tmp_path / profile.name).write_bytes(profile.read_bytes())
    writer = TraceWriter(trace_path, header(("train.py",)))
    data = {"path": profile.name, "reason": "oom"}
    writer.event(Event(T0 + 1.0, EventKind.SNAPSHOT, PID, data))
    writer.close(ExitInfo(T0 + 2.0, exit_code=1))
    warnings: list[str] = []

    assert load_allocations(load_trace(trace_path), warnings) is None
    assert warnings == []
