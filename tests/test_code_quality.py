"""The code base keeps its own rules: lint, format, strict types, and one-way imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    result = _run(_tool("ruff"), "check", "memdoc", "tests", "examples", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_code_is_formatted() -> None:
    result = _run(_tool("ruff"), "format", "--check", "memdoc")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_type_checks_strictly() -> None:
    result = _run(_tool("mypy"), "--strict", "memdoc")
    assert result.returncode == 0, result.stdout + result.stderr


def test_imports_run_one_way_from_cli_down_to_trace() -> None:
    result = _run(_tool("lint-imports"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_memdoc_imports_no_framework_by_itself() -> None:
    code = (
        "import sys, memdoc, memdoc.cli.main, memdoc.session, memdoc.collectors.registry;"
        "memdoc.cli.main.build_parser();"
        "bad = [m for m in ('torch', 'tensorflow', 'jax', 'pynvml') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
