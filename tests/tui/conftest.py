"""Shared pieces of the dashboard tests: demo traces, a frozen clock, fixed findings."""

from __future__ import annotations

import asyncio
import functools
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from benchmarks.demo_trace import DemoRun, write_demo_trace
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.trace import Trace

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


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


class Terminal:
    """One tmux session running one command; the screen is read as text.

    Each terminal has a tmux server of its own (its own socket): with one shared server, a
    session opened just as the last one closed could reach a server on its way out ("server
    exited unexpectedly").
    """

    def __init__(self, status_file: Path, size: tuple[int, int]) -> None:
        self.name = f"memdoc-test-{uuid.uuid4().hex[:8]}"
        self.status_file = status_file
        width, height = size
        self._tmux("new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height))
        self._socket = Path(self._tmux("display", "-p", "#{socket_path}").strip())

    def _tmux(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True)
        if check and done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def start(self, command: str) -> None:
        # Typed into the shell once its prompt is up: a program started with the pane could
        # read the pane's size before tmux settles it.
        deadline = time.monotonic() + 10
        while not self.screen().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        # The status is written by the next prompt, not by `; echo $?`: a command that dies
        # of Ctrl-C's SIGINT (as memdoc does when its program did) ends the whole line, as
        # `python` would.
        self.press(f"PROMPT_COMMAND='echo $? > {self.status_file}'; clear; {command}", "Enter")

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name, check=False)

    def press(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys)

    def wait_for(self, text: str, timeout_s: float = 20.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            if time.monotonic() > deadline:
                shape = "#{window_width}x#{window_height}"
                size = self._tmux("display", "-p", "-t", self.name, shape, check=False).strip()
                raise AssertionError(f"{text!r} never appeared; the {size} screen was:\n{screen}")
            time.sleep(0.1)

    def wait_gone(self, text: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text in self.screen():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} stayed on the screen:\n{self.screen()}")
            time.sleep(0.1)

    def exit_status(self, timeout_s: float = 10.0) -> int:
        deadline = time.monotonic() + timeout_s
        while not self.status_file.exists() or not self.status_file.read_text().strip():
            if time.monotonic() > deadline:
                raise AssertionError(f"the command did not exit; the screen was:\n{self.screen()}")
            time.sleep(0.1)
        return int(self.status_file.read_text())

    def close(self) -> None:
        self._tmux("kill-server", check=False)
        self._socket.unlink(missing_ok=True)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[type[Terminal]]:
    opened: list[Terminal] = []

    def open_terminal(command: str, size: tuple[int, int] = (100, 32)) -> Terminal:
        term = Terminal(tmp_path / f"status-{len(opened)}", size)
        opened.append(term)  # closed after the test, whatever happens in start()
        term.start(command)
        return term

    yield open_terminal  # type: ignore[misc]
    for term in opened:
        term.close()
