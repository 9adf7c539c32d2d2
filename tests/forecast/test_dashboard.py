"""The dashboard's forecast line, driven through Textual's Pilot on a replayed trace."""

from __future__ import annotations

from pathlib import Path

from memdoc.trace import load_trace
from memdoc.tui.app import make_app
from memdoc.tui.sources import ReplaySource
from tests.forecast.test_live import MiB, recorded
from tests.tui.conftest import ManualClock, drive, no_rules, wait_for

SIZE = (100, 32)


@drive
async def test_the_forecast_line_appears_once_the_forecast_is_written(tmp_path: Path) -> None:
    path = recorded(tmp_path, [300 * MiB + 5 * MiB * i for i in range(60)])
    trace = load_trace(path)
    (event,) = trace.events("forecast")
    before = ReplaySource(trace, clock=ManualClock(), paused=True, start_s=event.t - 0.5)  # type: ignore[arg-type]
    app = make_app(before, rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        assert app.view is not None and app.view.forecast is None
        assert not app.forecast.has_class("-visible")
    after = ReplaySource(trace, clock=ManualClock(), paused=True, start_s=event.t + 0.5)  # type: ignore[arg-type]
    app = make_app(after, rules=no_rules)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None)
        assert app.forecast.has_class("-visible")
        text = str(app.forecast.render())
        assert "OOM forecast: +5.0 MiB/step" in text
        assert "address-space cap (RLIMIT_AS)" in text
