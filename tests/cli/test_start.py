"""What `memdoc` loads before it knows the command: the parser alone, never the report, the
dashboard, the rules or the sessions. Checked in a fresh interpreter, on what it imported,
not on how long it took (timings are in `python -m benchmarks --only start`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Layers a command loads when it runs; building the parser must not load any of them. (Small
# modules of names and helpers, such as memdoc.metrics.identity, may be loaded.)
HEAVY = (
    "plotly",
    "rich",
    "textual",
    "prometheus_client",
    "psutil",
    "pynvml",
    "memdoc.api",
    "memdoc.session",
    "memdoc.recordings",
    "memdoc.report",
    "memdoc.rules",
    "memdoc.tui",
    "memdoc.metrics.families",
    "memdoc.metrics.server",
    "memdoc.importers",
    "memdoc.forecast",
    "memdoc.trace.reader",
    "memdoc.trace.writer",
    "memdoc.oom.pytorch",
    "memdoc.run.parent",
    "memdoc.run.agent",
)

_PROBE = """
import json, sys
from memdoc.cli.main import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
json.dump({"status": status, "modules": sorted(sys.modules)}, sys.__stderr__)
"""


def _loaded(*argv: str) -> tuple[object, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, timeout=60, check=False
    )
    report = json.loads(done.stderr.decode().strip().splitlines()[-1])
    return report["status"], report["modules"]


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY)]


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("--version",), id="version"),
        pytest.param(("--help",), id="help"),
        pytest.param(("run", "--help"), id="run-help"),
        pytest.param(("explain", "--help"), id="explain-help"),
    ],
)
def test_the_parser_loads_no_heavy_layer(argv: tuple[str, ...]) -> None:
    status, modules = _loaded(*argv)

    assert status == 0
    assert "memdoc.cli.main" in modules
    # A command module imports these inside its run function, not at its top.
    assert _heavy(modules) == [], "loaded before the command runs"


def test_import_memdoc_loads_no_session_until_one_is_used() -> None:
    probe = (
        "import sys, memdoc\n"
        "before = 'memdoc.api' in sys.modules\n"
        "step = memdoc.step\n"
        "print(before, 'memdoc.api' in sys.modules, step.__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, timeout=60, check=True
    )

    assert done.stdout.decode().split() == ["False", "True", "memdoc.api"]
