"""The live dashboard's CPU share at four refreshes a second with eight devices, headless."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from benchmarks.harness import Context, Figure, Target, last_line, run_timed, summarise, unavailable

DEVICES = 8
REFRESH_PER_S = 4
TARGET = Target(5.0, "< 5% of a core")
TITLE = f"dashboard CPU, {REFRESH_PER_S} refreshes/s, {DEVICES} devices"
# In a process of its own, so that nothing else this suite did is counted.
_MEASURE = (
    "import sys\n"
    f"sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n"
    "from benchmarks.dashboard_cost import dashboard_cpu_seconds\n"
    "print(dashboard_cpu_seconds(float(sys.argv[1]), devices={devices}, refreshes_per_s={rate}))\n"
)


def dashboard_group(ctx: Context) -> list[Figure]:
    if importlib.util.find_spec("benchmarks.dashboard_cost") is None:
        reason = "not available yet (benchmarks.dashboard_cost.dashboard_cpu_seconds is missing)"
        return [unavailable("dashboard.cpu", TITLE, "% core", reason, TARGET)]
    seconds = ctx.pick(5.0, 15.0)
    code = _MEASURE.format(devices=DEVICES, rate=REFRESH_PER_S)
    shares = []
    for repeat in range(ctx.pick(1, 3)):
        ctx.log(f"dashboard {repeat + 1}: {seconds:g} s headless over a replayed trace")
        _, done = run_timed(
            [sys.executable, "-c", code, str(seconds)], cwd=ctx.workdir, timeout_s=300
        )
        if done.returncode != 0:
            reason = f"the measure failed (exit {done.returncode}): {last_line(done.stderr)}"
            return [unavailable("dashboard.cpu", TITLE, "% core", reason, TARGET)]
        shares.append(100 * float(done.stdout.decode().split()[-1]) / seconds)
    note = f"{seconds:g} s headless (Textual run_test), replaying an {DEVICES}-GPU trace"
    return [summarise("dashboard.cpu", TITLE, shares, "% core", target=TARGET, note=note)]
