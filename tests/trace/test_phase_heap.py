"""What a loop phase kept, less the freed memory the C heap kept for later: measured on the
real heap, and read from phase marks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.collectors.loops import hub
from memdoc.trace import load_trace
from memdoc.trace.phases import phases
from tests.rules.recorder import MiB, Recorder

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")


# Run in a fresh interpreter: a test worker's heap, shaped by the tests before, may place
# and free blocks so that the freed ones join the heap's top and go back to the system.
_FREED_BETWEEN_HELD = """
from memdoc.collectors.own import heap_free
# 64 KiB blocks come from the heap's arenas (not mapped), each followed by a 2 KiB block that
# stays held (from malloc too: over Python's own small-object limit).
blocks, pins = [], []
for _ in range(1000):
    blocks.append(bytearray(64 << 10))
    pins.append(bytearray(2 << 10))
before = heap_free()
blocks.clear()
print(before, heap_free())
"""


@linux
def test_memory_freed_between_blocks_still_held_is_kept_by_the_heap_and_counted_free() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FREED_BETWEEN_HELD], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    before, after = (int(v) for v in done.stdout.split())
    assert after - before >= 56 * MiB  # 62.5 MiB freed


@linux
def test_every_phase_mark_carries_the_heaps_free_memory() -> None:
    assert "heap_free_bytes" in hub._memory()["host"]


def _run(path: Path, free_at_marks: list[int | None]) -> list[int | None]:
    """Training, evaluation and training again; the evaluation leaves the process 60 MiB
    larger. `free_at_marks`: the heap's free memory each mark read (None: not read)."""
    rec = Recorder(path)
    rss = [400 * MiB, 410 * MiB, 470 * MiB, 470 * MiB]
    for index, (label, resident, free) in enumerate(
        zip(["train", "eval", "train", "phase ended"], rss, free_at_marks, strict=True)
    ):
        host = {"rss_bytes": resident, **({"heap_free_bytes": free} if free is not None else {})}
        phase = None if label == "phase ended" else label
        rec.event(1.0 + index, "mark", label=label, phase=phase, source="keras", host=host)
    rec.end(5.0, exit_code=0)
    return [p.kept_bytes for p in phases(load_trace(path))]


def test_an_evaluation_whose_temporaries_the_heap_kept_kept_nothing(tmp_path: Path) -> None:
    kept = _run(tmp_path / "run.memdoc", [10 * MiB, 10 * MiB, 70 * MiB, 70 * MiB])
    assert kept == [10 * MiB, 0, 0]


def test_an_evaluation_that_kept_its_outputs_kept_them_whatever_the_heap(tmp_path: Path) -> None:
    kept = _run(tmp_path / "run.memdoc", [10 * MiB, 10 * MiB, 10 * MiB, 10 * MiB])
    assert kept == [10 * MiB, 60 * MiB, 0]


def test_marks_without_the_heaps_figure_read_the_resident_memory(tmp_path: Path) -> None:
    kept = _run(tmp_path / "run.memdoc", [None, None, None, None])
    assert kept == [10 * MiB, 60 * MiB, 0]
