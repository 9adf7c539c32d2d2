"""Run a memdoc command in this process, as the CLI would, and keep what it printed."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from memdoc.cli.main import main


@dataclass(frozen=True)
class Said:
    status: int
    stdout: str
    stderr: str

    def one_clear_error(self) -> bool:
        """memdoc's error form: an `error:` line, at most a hint after it, nothing else."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("memdoc: error: ")]
        others = [
            line for line in lines if not line.startswith(("memdoc: error: ", "memdoc: hint: "))
        ]
        return len(errors) == 1 and not others


def memdoc(*args: str) -> Said:
    """`memdoc ARGS` in process. An exception escaping main() is what a user would see as a
    traceback, so it is not caught here: the test fails with it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    return Said(status, out.getvalue(), err.getvalue())
