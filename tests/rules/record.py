"""Record a rule fixture from a real program: `memdoc run` it, then write the trace with
the paths of this checkout and its virtual environment taken out, so that the fixture
reads the same wherever it was recorded.

    python -m tests.rules.record PROGRAM OUT.memdoc [NAME=VALUE ...]

PROGRAM is a file in tests/rules/programs; NAME=VALUE pairs go to its environment. The
program may fail (that is usually the point): the trace is kept whatever its exit."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

PROGRAMS = Path(__file__).resolve().parent / "programs"
REPO = PROGRAMS.parent.parent.parent


def scrub(text: str, *, cwd: str, programs: Path = PROGRAMS) -> str:
    """The trace's text with machine paths replaced by the names a fixture keeps: the
    programs' folder (`programs`, named from the checkout's root as the run's cwd), the
    temporary folder the run was in (`cwd`), the virtual environment and the checkout."""
    site = sysconfig.get_paths()["purelib"]
    for before, after in (
        (f"{site}/", "site-packages/"),
        (f"{programs}/", ""),
        (f'"{sys.executable}"', '"python3"'),
        (f'"cwd":"{cwd}"', f'"cwd":"{programs.relative_to(REPO)}"'),
        (f"{cwd}/", ""),
        (f"{REPO}/", ""),
    ):
        text = text.replace(before, after)
    return text


def record(program: str, out: Path, env: dict[str, str]) -> int:
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "run.memdoc"
        done = subprocess.run(
            [sys.executable, "-m", "memdoc", "run", "-q", "-o", str(trace)]
            + [str(PROGRAMS / program)],
            env={**os.environ, **env},
            cwd=folder,
            check=False,
        )
        out.write_text(scrub(trace.read_text(), cwd=folder))
    return done.returncode


if __name__ == "__main__":
    pairs = dict(arg.split("=", 1) for arg in sys.argv[3:])
    print(f"program exited {record(sys.argv[1], Path(sys.argv[2]), pairs)}")
