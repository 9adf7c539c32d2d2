"""CPU-only runs are diagnosed from host memory: a real program, watched by memdoc, on this host."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memdoc.rules.engine import diagnose
from memdoc.trace import load_trace

PROGRAM = textwrap.dedent(
    """
    import sys, time
    import memdoc

    kept = []
    with memdoc.watch(sys.argv[1], interval=0.02, quiet=True):
        for step in range(12):
            block = bytearray(40 * 1024 * 1024)
            if sys.argv[2] == "leak":
                kept.append(block)  # never released
            scratch = bytearray(30 * 1024 * 1024)
            time.sleep(0.05)
            del block, scratch
            memdoc.step()
    """
)


def _watched_run(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(PROGRAM, encoding="utf-8")
    trace_path = tmp_path / "run.memdoc"
    subprocess.run([sys.executable, str(script), str(trace_path), mode], check=True, timeout=120)
    return [f.rule for f in diagnose(load_trace(trace_path))]


@pytest.mark.parametrize(
    ("mode", "leaks"),
    [
        pytest.param("leak", True, id="keeps-a-block-per-step"),
        pytest.param("free", False, id="frees-it"),
    ],
)
def test_a_host_memory_leak_is_found_from_rss_at_step_boundaries(
    tmp_path: Path, mode: str, leaks: bool
) -> None:
    rules = _watched_run(tmp_path, mode)

    assert ("leak-across-steps" in rules) is leaks, rules
