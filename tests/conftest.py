"""Shared test helpers: run memdoc as a user would, in a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


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
