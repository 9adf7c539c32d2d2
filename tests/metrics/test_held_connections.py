"""Connections that send half a request and wait: closed after a few seconds, and never
more than a few threads in the memdoc process that records the run."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from memdoc.metrics.server import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from tests.conftest import memdoc_cmd
from tests.metrics.scrape import only, scrape, wait_for_url

PROGRAM = Path(__file__).resolve().parent / "stepping_program.py"
HELD = 60
HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    env = {**os.environ, "SLURM_JOB_ID": "7"}
    env.pop("MEMDOC_AGENT", None)
    stop = tmp_path / "stop"
    command = memdoc_cmd(
        "run", "--metrics-port", "0", "--metrics-grace", "0", "-o", str(tmp_path / "t.memdoc")
    )
    proc = subprocess.Popen(
        [*command, str(PROGRAM), str(stop)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc, wait_for_url(proc)
    finally:
        stop.touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _hold(url: str, count: int) -> list[socket.socket]:
    parts = urlsplit(url)
    held = []
    for _ in range(count):
        sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
        sock.sendall(HALF_REQUEST)
        held.append(sock)
    return held


def _closed_by_the_server(held: list[socket.socket], wait_s: float) -> int:
    """How many of `held` the server closed (after an answer or not) within `wait_s`."""
    deadline = time.monotonic() + wait_s
    open_ = set(held)
    while open_ and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_), [], [], max(0.0, deadline - time.monotonic()))
        for sock in ready:
            try:
                if sock.recv(4096):
                    continue  # a 408 or any answer: its end comes next
            except OSError:
                pass  # reset
            open_.discard(sock)
    return len(held) - len(open_)


def test_half_sent_requests_are_closed_and_the_threads_stay_bounded(
    served: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, url = served
    scrape(url)
    time.sleep(1.0)  # the run's own threads have started
    before = _threads(proc.pid)

    held = _hold(url, HELD)
    try:
        time.sleep(0.5)
        during = _threads(proc.pid)
        started = time.monotonic()
        closed = _closed_by_the_server(held, REQUEST_TIMEOUT_S + 5)
        waited_s = time.monotonic() - started
    finally:
        for sock in held:
            sock.close()

    assert during <= before + MAX_CONNECTIONS, (before, during)
    assert closed == HELD
    assert waited_s < REQUEST_TIMEOUT_S + 4
    time.sleep(0.5)
    assert _threads(proc.pid) <= before + 1
    assert only(scrape(url), "memdoc_running", job="7").value == 1.0
