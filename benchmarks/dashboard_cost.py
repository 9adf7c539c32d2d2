"""The dashboard's cost: CPU seconds to drive it headless over an 8-device trace."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from benchmarks.demo_trace import DemoRun, write_demo_trace
from memdoc.trace import load_trace
from memdoc.tui.app import MemdocApp, make_app
from memdoc.tui.sources import ReplaySource

TERMINAL_SIZE = (120, 40)
_SETTLE_TIMEOUT_S = 10.0


def dashboard_cpu_seconds(
    seconds: float = 10.0,
    *,
    devices: int = 8,
    refreshes_per_s: float = 4.0,
    size: tuple[int, int] = TERMINAL_SIZE,
) -> float:
    """CPU seconds this process spends showing a replay of a `devices`-GPU run for `seconds`.

    The trace is written and loaded before measuring; the measure covers the feed worker
    (polling, frames, the rules every two seconds) and Textual's rendering, at
    `refreshes_per_s`. Divide by `seconds` for the share of one core.
    """
    with tempfile.TemporaryDirectory(prefix="memdoc-bench-") as folder:
        path = Path(folder) / "bench.memdoc"
        run = DemoRun(devices=devices, seconds=max(30.0, seconds * 1.5), oom=False)
        write_demo_trace(path, run)
        trace = load_trace(path)
    source = ReplaySource(trace, speed=1.0)
    app = make_app(source, refresh_interval_s=1.0 / refreshes_per_s)
    return asyncio.run(_drive(app, seconds, size))


async def _drive(app: MemdocApp, seconds: float, size: tuple[int, int]) -> float:
    async with app.run_test(headless=True, size=size) as pilot:
        deadline = time.monotonic() + _SETTLE_TIMEOUT_S
        while app.frames_shown < 2 and time.monotonic() < deadline:
            await pilot.pause(0.05)
        start = time.process_time()
        await asyncio.sleep(seconds)
        used = time.process_time() - start
        await pilot.press("q")
    return used
