"""The endpoint stays up for the grace period after the program ended, so that the end of
the run can be scraped, then closes."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
from pathlib import Path

from memdoc.trace import load_trace
from tests.conftest import memdoc_cmd
from tests.metrics.scrape import Sample, only, scrape, wait_for_url

PROGRAM = Path(__file__).resolve().parent / "stepping_program.py"
GRACE_S = 4.0


def _scrape_until_ended(url: str, proc: subprocess.Popen[bytes]) -> list[Sample] | None:
    """The first scrape that says the run ended; None when the endpoint went first."""
    while proc.poll() is None:
        try:
            samples = scrape(url)
        except (urllib.error.URLError, ConnectionError):
            return None
        if only(samples, "memdoc_running").value == 0.0:
            return samples
        time.sleep(0.1)
    return None


def test_the_end_of_the_run_can_be_scraped_during_the_grace_period(tmp_path: Path) -> None:
    trace, stop = tmp_path / "run.memdoc", tmp_path / "stop"
    env = dict(os.environ)
    env.pop("MEMDOC_AGENT", None)
    command = memdoc_cmd("run", "--metrics-port", "0", "--metrics-grace", str(GRACE_S))
    proc = subprocess.Popen(
        [*command, "-o", str(trace), str(PROGRAM), str(stop)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = wait_for_url(proc)
        time.sleep(1.0)
        stop.touch()
        ended = _scrape_until_ended(url, proc)
        ended_at = time.monotonic()
        proc.wait(timeout=GRACE_S + 20)
        lingered_s = time.monotonic() - ended_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert ended is not None, "the endpoint closed before the end of the run was scraped"
    steps = len(load_trace(trace).steps())
    assert steps > 0 and only(ended, "memdoc_steps_total").value == steps
    assert lingered_s < GRACE_S + 10  # then it closed by itself
    assert proc.returncode == 0
