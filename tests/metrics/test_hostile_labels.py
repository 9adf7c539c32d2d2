"""Label values from the environment that are not valid text are made printable once: every
scrape is answered, and nothing is printed on the program's stderr."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.conftest import memdoc_cmd
from tests.metrics.scrape import only, scrape, wait_for_url

PROGRAM = Path(__file__).resolve().parent / "stepping_program.py"


def test_a_job_id_with_invalid_bytes_is_scraped_as_printable_text(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    env: dict[bytes, bytes] = {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    env.pop(b"MEMDOC_AGENT", None)
    env[b"SLURM_JOB_ID"] = b"job\xff\xfe\x1b[31m"
    command = memdoc_cmd("run", "--metrics-port", "0", "--metrics-grace", "0")
    proc = subprocess.Popen(
        [*command, "-o", str(tmp_path / "t.memdoc"), str(PROGRAM), str(stop)],
        env=env,  # type: ignore[arg-type]
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = wait_for_url(proc)
        time.sleep(0.5)
        scrapes = [scrape(url) for _ in range(3)]
        stop.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    for samples in scrapes:
        running = only(samples, "memdoc_running")
        assert running.labels["job"] == "job\ufffd\ufffd\\x1b[31m"
    assert b"Traceback" not in err
    # No server error was logged ('"GET /metrics HTTP/1.1" 500', "code 500"): the bare number
    # would also match a temporary folder's name (pytest-500).
    assert b'" 500 ' not in err and b"code 500" not in err
