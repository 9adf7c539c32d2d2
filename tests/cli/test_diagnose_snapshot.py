"""`memdoc diagnose` and `memdoc report` of a PyTorch snapshot that records no out-of-memory
error: memdoc cannot know whether the run failed, says so, and shows where the memory was."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_memdoc
from tests.importers.snapshot_dicts import OPT_SNAPSHOT

BIGGEST_HOLDER = "flexgen/pytorch_backend.py:195:allocate"
NO_RECORD = (
    "The snapshot holds no out-of-memory record: memdoc cannot tell from it whether this run "
    "ran out of memory."
)


def _words(text: str) -> str:
    return " ".join(text.split())


def test_diagnose_of_a_snapshot_without_an_oom_says_it_cannot_tell_and_where_memory_was() -> None:
    done = run_memdoc("diagnose", str(OPT_SNAPSHOT))

    out = _words(done.stdout.decode())
    assert done.returncode == 0, done.stderr.decode()
    assert "No memory problem found" not in out
    assert f"Why {NO_RECORD}" in out
    assert "Where the memory was on GPU 0 (5.3 GiB live), largest first: 5.3 GiB (100%)" in out
    assert BIGGEST_HOLDER in out.split("Where the memory was", 1)[1].split("Where the", 1)[0]


def test_the_report_of_such_a_snapshot_says_the_same(tmp_path: Path) -> None:
    done = run_memdoc("report", str(OPT_SNAPSHOT), "-o", str(tmp_path / "snapshot.html"))

    page = _words((tmp_path / "snapshot.html").read_text())
    assert done.returncode == 0, done.stderr.decode()
    assert NO_RECORD in page
    assert "No memory problem found" not in page
