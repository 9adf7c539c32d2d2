"""`memdoc run --metrics-port`: a real run scraped over HTTP, checked against its own trace."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from memdoc.trace import Metric, load_trace
from tests.conftest import memdoc_cmd, run_memdoc
from tests.metrics.scrape import Sample, only, scrape, wait_for_url

PROGRAM = Path(__file__).resolve().parent / "stepping_program.py"
JOB = {"host": socket.gethostname(), "job": "4242"}


@dataclass
class Scraped:
    before_t: float  # unix time when the scrape was sent
    after_t: float  # and when its answer was read
    samples: list[Sample]


@dataclass
class ServedRun:
    url: str
    trace: Path
    scrapes: list[Scraped]
    stdout: bytes
    returncode: int
    post_status: int


# One worker runs the module: its shared run is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("served-run")


@pytest.fixture(scope="module")
def served_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedRun]:
    tmp = tmp_path_factory.mktemp("served")
    trace, stop = tmp / "run.memdoc", tmp / "stop"
    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    env.pop("MEMDOC_AGENT", None)
    proc = subprocess.Popen(
        memdoc_cmd(
            "run",
            "--metrics-port",
            "0",
            "--metrics-grace",
            "0",
            "-o",
            str(trace),
            str(PROGRAM),
            str(stop),
        ),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = wait_for_url(proc)
        scrapes = []
        for _ in range(3):
            time.sleep(1.5)
            before = time.time()
            samples = scrape(url)
            scrapes.append(Scraped(before, time.time(), samples))
        request = urllib.request.Request(url, data=b"x", method="POST")
        try:
            urllib.request.urlopen(request, timeout=5)
            post_status = 200
        except urllib.error.HTTPError as exc:
            post_status = exc.code
        stop.touch()
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    yield ServedRun(url, trace, scrapes, stdout, proc.returncode, post_status)


def test_it_binds_to_loopback_and_the_program_runs_as_without_memdoc(served_run: ServedRun) -> None:
    assert served_run.url.startswith("http://127.0.0.1:")
    assert served_run.returncode == 0
    assert served_run.stdout.startswith(b"steps ")


def test_host_rss_is_a_value_the_trace_recorded_just_before_the_scrape(
    served_run: ServedRun,
) -> None:
    trace = load_trace(served_run.trace)
    rss = trace.series(Metric.HOST_RSS)
    assert rss is not None
    for scraped in served_run.scrapes:
        value = only(scraped.samples, "memdoc_host_rss_bytes", **JOB).value
        start = scraped.before_t - trace.header.created_unix
        end = scraped.after_t - trace.header.created_unix
        # The writer flushes at least once a second: the scrape shows a sample of the last
        # seconds before it, exactly as recorded.
        _, recent = rss.window(start - 3.0, end)
        assert value in recent, (value, list(recent))


def test_step_count_is_the_traces_count_at_the_scrape(served_run: ServedRun) -> None:
    trace = load_trace(served_run.trace)
    step_times = [e.t for e in trace.steps()]
    counts = []
    for scraped in served_run.scrapes:
        steps = only(scraped.samples, "memdoc_steps_total", **JOB).value
        start = scraped.before_t - trace.header.created_unix
        end = scraped.after_t - trace.header.created_unix
        assert sum(st <= start - 3.0 for st in step_times) <= steps
        assert steps <= sum(st <= end for st in step_times)
        rate = only(scraped.samples, "memdoc_step_rate_per_second", **JOB).value
        assert 1 < rate < 21  # one step every 50 ms at most, slower on a busy machine
        counts.append(steps)
    assert counts == sorted(counts) and counts[-1] > counts[0]


def test_every_series_carries_the_job_labels_and_nothing_else_is_exposed(
    served_run: ServedRun,
) -> None:
    samples = served_run.scrapes[-1].samples
    assert {s.name for s in samples} >= {
        "memdoc_info",
        "memdoc_running",
        "memdoc_host_rss_bytes",
        "memdoc_host_limit_bytes",
        "memdoc_steps_total",
        "memdoc_ooms_total",
    }
    for sample in samples:
        assert sample.name.startswith("memdoc_"), sample.name  # no process_/python_ metrics
        assert sample.labels["host"] == JOB["host"] and sample.labels["job"] == "4242"
    assert only(samples, "memdoc_running", **JOB).value == 1.0
    assert only(samples, "memdoc_ooms_total", **JOB).value == 0.0
    assert only(samples, "memdoc_host_limit_bytes", kind="ram").value > 0


def test_nothing_but_get_is_answered(served_run: ServedRun) -> None:
    assert served_run.post_status == 405


def test_the_exporter_stops_with_the_run(served_run: ServedRun) -> None:
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(served_run.url, timeout=5)


def test_a_port_already_taken_is_one_clear_line_and_the_program_does_not_start(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        marker = tmp_path / "ran"
        done = run_memdoc(
            "run",
            "--metrics-port",
            str(port),
            "-o",
            str(tmp_path / "t.memdoc"),
            "--",
            "touch",
            str(marker),
        )

    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert lines[0].startswith(f"memdoc: error: cannot serve metrics on 127.0.0.1:{port} (")
    assert "Traceback" not in done.stderr.decode()
    assert not marker.exists()


def test_a_port_out_of_range_is_one_clear_line(tmp_path: Path) -> None:
    done = run_memdoc("run", "--metrics-port", "70000", "--", "true")

    assert done.returncode == 2
    assert done.stderr.decode().splitlines()[0] == (
        "memdoc: error: metrics port 70000 is not a port (0 to 65535)"
    )


def test_an_address_this_machine_does_not_have_is_one_clear_line() -> None:
    done = run_memdoc("run", "--metrics-port", "0", "--metrics-address", "192.0.2.1", "--", "true")

    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert lines[0].startswith("memdoc: error: cannot serve metrics on 192.0.2.1:0 (")
    assert lines[1].startswith("memdoc: hint: ")


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("hôte\u2028", id="non-ascii"),
        pytest.param("ü" * 70, id="non-ascii-over-long"),
        pytest.param("h\udcff", id="invalid-bytes"),
        pytest.param("a" * 300, id="over-long"),
        pytest.param("x." + "b" * 70 + ".example", id="over-long-label"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("run", "--metrics-port", "0", "--metrics-address"), id="run"),
        pytest.param(("top", "--serve", "0", "--serve-address"), id="top"),
    ],
)
def test_an_address_that_is_no_host_name_is_one_clear_line_and_exit_2(
    tmp_path: Path, command: tuple[str, ...], address: str
) -> None:
    marker = tmp_path / "ran"
    program = ("-o", str(tmp_path / "t.memdoc"), "--", "touch", str(marker))
    done = run_memdoc(*command, address, *(program if command[0] == "run" else ()), timeout=30)

    assert done.returncode == 2
    err = done.stderr.decode()
    assert err.startswith("memdoc: error: cannot serve metrics on "), err
    assert "Traceback" not in err and len(err.splitlines()) <= 2
    assert not marker.exists()
