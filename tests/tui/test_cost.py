"""The benchmark's entry point for the dashboard's cost runs and measures (no timing asserted)."""

from __future__ import annotations

from benchmarks.dashboard_cost import dashboard_cpu_seconds


def test_the_cost_probe_drives_eight_devices_and_returns_cpu_seconds() -> None:
    used = dashboard_cpu_seconds(1.0, devices=8, size=(80, 30))
    assert 0.0 < used < 60.0
