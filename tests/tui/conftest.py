"""Shared pieces of the dashboard tests: demo traces, a frozen clock, fixed findings."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.trace import Trace
from memdoc.tui.demo import DemoRun, write_demo_trace

# The demo runs start at this instant; the frozen clock reads a little later.
DEMO_START_UNIX = DemoRun().created_unix
FROZEN_NOW_UNIX = DEMO_START_UNIX + 40.0


def frozen_clock() -> float:
    return FROZEN_NOW_UNIX


FINDINGS = (
    Finding(
        rule="fragmentation",
        code="MD001",
        title="Free memory is cached in the pool but not in one piece",
        confidence=0.7,
        summary="The pool held 25.0 GiB it was not using, more than the 4.0 GiB requested.",
        evidence=(Evidence("reserved but unallocated: 25.0 GiB, 6.2x the request"),),
        fixes=(
            Fix(
                "pytorch",
                "Let segments grow instead of splitting",
                "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            ),
        ),
    ),
    Finding(
        rule="other-process",
        code="MD002",
        title="Another process holds the GPU memory",
        confidence=0.55,
        summary="PID 9001 held 6.0 GiB of this GPU.",
        fixes=(Fix("any", "See who holds the GPU", "nvidia-smi --query-compute-apps=pid"),),
    ),
)


def fixed_rules(trace: Trace) -> list[Finding]:
    """Findings that do not depend on the rule catalogue, so that pictures stay stable."""
    return list(FINDINGS)


def no_rules(trace: Trace) -> list[Finding]:
    return []


@pytest.fixture(scope="session")
def demo_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-GPU run that ends in an OOM on GPU 0 at 30 s."""
    path = tmp_path_factory.mktemp("demo") / "run.memdoc"
    return write_demo_trace(path, DemoRun(devices=2, seconds=30.0))


@pytest.fixture(scope="session")
def demo_trace_8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run on eight GPUs."""
    path = tmp_path_factory.mktemp("demo8") / "run8.memdoc"
    return write_demo_trace(path, DemoRun(devices=8, seconds=30.0))


async def wait_for(
    pilot: Pilot[Any], condition: Callable[[], bool], timeout_s: float = 10.0
) -> None:
    """Let the app run until `condition` holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the dashboard did not get there in time")
        await pilot.pause(0.05)


class ManualClock:
    """A monotonic clock the test moves by hand (the replay's pace, without sleeping)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def drive(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body in its own event loop (Textual's Pilot is async)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run
