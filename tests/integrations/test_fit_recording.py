"""What every framework callback shares: fresh trace names, and the Lightning it subclasses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.integrations.fit import fresh_trace_path


def test_default_trace_names_never_reuse_an_existing_file(tmp_path: Path) -> None:
    first = fresh_trace_path("keras", tmp_path)
    first.write_text("taken")

    second = fresh_trace_path("keras", tmp_path)

    assert second != first
    assert second.name.startswith("memdoc-keras-") and second.suffix == ".memdoc"
    assert first.read_text() == "taken"


@pytest.mark.slow
@pytest.mark.parametrize(
    "package",
    [pytest.param("lightning.pytorch", id="lightning"), pytest.param("pytorch_lightning", id="pl")],
)
def test_lightning_callback_subclasses_the_package_the_program_imported(package: str) -> None:
    code = (
        f"import {package} as pl\n"
        "from memdoc.integrations.lightning import MemdocCallback\n"
        "assert issubclass(MemdocCallback, pl.Callback), MemdocCallback.__mro__\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-2000:]
