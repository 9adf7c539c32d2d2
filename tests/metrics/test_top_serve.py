"""`memdoc top --serve`: the system view's metrics, headless or beside the dashboard."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memdoc.metrics.families import MemdocCollector
from memdoc.metrics.identity import JobIdentity
from memdoc.metrics.server import serve
from memdoc.metrics.sources import SharedTraceSource
from memdoc.rules.base import Finding
from memdoc.trace.reader import Trace
from memdoc.tui.system import SystemSource
from tests.collectors.nvml_standin import gate_from_nvidia_smi_xml
from tests.conftest import FIXTURES, memdoc_cmd
from tests.metrics.scrape import only, scrape, wait_for_url

MiB = 1024**2
DUAL_A5000 = FIXTURES / "importers" / "nvidia-smi-xml" / "dual_a5000-v13.xml"
RECORDED_PID = 100477


def test_headless_top_serves_until_sigterm_and_exits_cleanly() -> None:
    env = dict(os.environ)
    env.pop("MEMDOC_AGENT", None)
    proc = subprocess.Popen(
        memdoc_cmd("top", "--serve", "0", "--interval", "0.2"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = wait_for_url(proc)
        samples = scrape(url)
        assert url.startswith("http://127.0.0.1:")
        assert only(samples, "memdoc_running").value == 1.0
        assert only(samples, "memdoc_host_available_bytes").value > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def system() -> Iterator[tuple[SystemSource, threading.Lock]]:
    source = SystemSource(0.05, gate_factory=lambda: gate_from_nvidia_smi_xml(DUAL_A5000))
    yield source, threading.Lock()
    source.close()


def test_every_gpu_process_of_the_machine_is_exposed_as_nobodys(
    system: tuple[SystemSource, threading.Lock],
) -> None:
    source, lock = system
    with lock:
        source.poll()
    state = SharedTraceSource(lambda: source.trace, lock)
    server = serve(MemdocCollector(state, JobIdentity("node-a")), 0)
    try:
        samples = scrape(server.url)
    finally:
        server.stop()

    proc = only(samples, "memdoc_process_gpu_used_bytes", device="0", pid=str(RECORDED_PID))
    assert proc.value == 22430 * MiB and proc.labels["ours"] == "false"
    # In a system view every process is just a process: the ledger counts them in one term.
    processes = only(samples, "memdoc_device_memory_bytes", device="0", term="other_processes")
    assert processes.value == 22430 * MiB
    assert only(samples, "memdoc_device_total_bytes", device="1").value == 24564 * MiB


def test_a_scrape_waits_for_a_sample_being_added_and_never_sees_half_of_it(
    system: tuple[SystemSource, threading.Lock],
) -> None:
    source, lock = system
    state = SharedTraceSource(lambda: source.trace, lock)
    lock.acquire()  # a sample in progress
    result: list[object] = []
    scraper = threading.Thread(target=lambda: result.append(state.snapshot()))
    scraper.start()
    scraper.join(0.3)
    assert scraper.is_alive() and not result
    source.poll()
    lock.release()
    scraper.join(5)
    assert result and result[0] is not None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_in_a_terminal_the_dashboard_runs_and_the_metrics_are_served_beside_it(
    tmp_path: Path,
) -> None:
    from tests.tui.conftest import Terminal

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    term = Terminal(tmp_path / "status", (100, 32))
    try:
        command = [sys.executable, "-m", "memdoc", "top", "--interval", "0.5", "--serve", str(port)]
        term.start(" ".join(command))
        term.wait_for("available")  # the dashboard is up (the typed command says "memdoc top")
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
        assert only(samples, "memdoc_host_available_bytes").value > 0
        term.press("q")
        assert term.exit_status() == 0
    finally:
        term.close()


def test_the_catalogue_runs_on_a_copy_so_the_sampler_is_never_held_up_by_it(
    system: tuple[SystemSource, threading.Lock],
) -> None:
    source, lock = system
    with lock:
        source.poll()
    diagnosing, finish = threading.Event(), threading.Event()
    seen: list[Trace] = []

    def slow_diagnosis(trace: Trace) -> list[Finding]:
        seen.append(trace)
        diagnosing.set()
        finish.wait(10)
        return []

    state = SharedTraceSource(lambda: source.trace, lock, diagnose_fn=slow_diagnosis)
    scraper = threading.Thread(target=state.snapshot)
    scraper.start()
    try:
        assert diagnosing.wait(5)
        # While the rules run, the sampler takes its lock and adds a sample.
        assert lock.acquire(timeout=2)
        source.poll()
        lock.release()
        assert seen[0] is not source.trace
    finally:
        finish.set()
        scraper.join(5)
    assert not scraper.is_alive()
