"""`memdoc live` and `memdoc top` as a person runs them: in a real terminal (tmux), by keys."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memdoc.collectors.nvml_gate import NO_DRIVER_REASON, NvmlUnavailable, open_gate
from tests.conftest import REPO, memdoc_cmd, run_memdoc
from tests.tui.conftest import needs_tmux


def _memdoc(*args: str) -> str:
    return " ".join([sys.executable, "-m", "memdoc", *args])


@needs_tmux
def test_live_follows_a_run_being_written_and_answers_keys(tmp_path: Path, terminal) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "run.memdoc"
    writer = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.demo_trace", str(trace), "--live", "--seconds", "60"],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 10
        while not trace.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        term = terminal(_memdoc("live", str(trace)))
        term.wait_for("● live")
        screen = term.wait_for("GPU 0 · H100 80GB HBM3")
        assert "memdoc live  run.memdoc" in screen
        term.wait_for("step ")  # samples and steps arrive while it runs
        term.press("?")
        term.wait_for("Show the GPU in that place")
        term.press("Escape")  # a key right after Escape would read as an escape sequence
        term.wait_gone("Show the GPU in that place")
        term.press("]")
        term.wait_for("GPU 1 · H100 80GB HBM3")
        term.press("q")
        assert term.exit_status() == 0
    finally:
        writer.terminate()
        writer.wait(timeout=10)


@needs_tmux
def test_live_replays_a_finished_run_and_seeks_to_its_oom(demo_trace: Path, terminal) -> None:  # type: ignore[no-untyped-def]
    term = terminal(_memdoc("live", str(demo_trace), "--speed", "2"), size=(60, 24))
    term.wait_for("▶ replay 2x")
    term.press("End")
    screen = term.wait_for("OUT OF MEMORY")
    assert "exit code 1" in screen
    term.press("q")
    assert term.exit_status() == 0


@needs_tmux
def test_top_shows_host_memory_and_says_once_why_there_is_no_gpu(terminal) -> None:  # type: ignore[no-untyped-def]
    try:
        open_gate().close()
        has_driver = True
    except NvmlUnavailable:
        has_driver = False
    term = terminal(_memdoc("top", "--interval", "0.5"))
    screen = term.wait_for("memdoc top")
    screen = term.wait_for("available")
    if not has_driver:
        assert screen.count(NO_DRIVER_REASON) == 1
        assert "Host memory" in screen
    term.press("?")
    term.wait_for("Keys")
    term.press("q")  # closes help
    term.wait_gone("Keys")
    term.press("q")
    assert term.exit_status() == 0


# A program that sleeps until the test says stop (a file appears), at most 30 s.
SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    for _ in range(300):
        if os.path.exists(sys.argv[1]):
            break
        time.sleep(0.1)
    """
)


@needs_tmux
def test_top_lists_a_program_running_under_memdoc_until_it_ends(tmp_path: Path, terminal) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    # Folders of this test's own: memdoc runs of other tests on the machine are not seen.
    runtime, private_tmp = tmp_path / "runtime", tmp_path / "tmp"
    runtime.mkdir(mode=0o700)
    private_tmp.mkdir()
    folders = {"XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(private_tmp)}
    stop = tmp_path / "stop"
    env = {**os.environ, **folders}
    env.pop("MEMDOC_AGENT", None)
    job = subprocess.Popen(
        memdoc_cmd("run", "-q", "-o", "job.memdoc", "sleeper.py", str(stop)), cwd=tmp_path, env=env
    )
    try:
        assignments = " ".join(f"{name}={value}" for name, value in folders.items())
        top = f"{assignments} {_memdoc('top', '--interval', '0.5')}"
        term = terminal(top, size=(60, 24))
        screen = term.wait_for("Under memdoc  1 running")
        assert f"sleeper.py {stop}"[:40] in screen
        screen = term.wait_for("job.memdoc")
        assert "RSS " in screen and "running " in screen
        stop.touch()
        assert job.wait(timeout=60) == 0
        term.wait_for("Under memdoc  none running")
        term.press("q")
        assert term.exit_status() == 0
    finally:
        stop.touch()
        job.wait(timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["live", "missing.memdoc"], "missing.memdoc: no such file", id="no-such-file"),
        pytest.param(["live", "{trace}", "--speed", "100"], "--speed must be between", id="speed"),
        pytest.param(["live", "{trace}"], "the dashboard needs a terminal", id="not-a-terminal"),
        pytest.param(["top", "--interval", "0"], "--interval", id="interval"),
    ],
)
def test_bad_use_gets_one_line_and_exit_status_2(
    demo_trace: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    done = run_memdoc(*(a.format(trace=demo_trace) for a in args), cwd=tmp_path, timeout=60)
    stderr = done.stderr.decode()
    assert done.returncode == 2
    assert message in stderr
    assert "Traceback" not in stderr


def test_a_file_that_is_neither_a_trace_nor_importable_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("just some words\n")
    done = run_memdoc("live", str(path), cwd=tmp_path, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr.decode()
    assert done.stderr.decode().count("\n") <= 2


@needs_tmux
def test_live_waits_for_a_trace_not_written_yet_and_follows_it_once_it_appears(
    tmp_path: Path, terminal
) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "run.memdoc"
    term = terminal(_memdoc("live", str(trace)))
    screen = term.wait_for("(ctrl+c to stop)").replace("\n", "")
    assert f"memdoc: waiting for {trace} to appear" in screen
    writer = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.demo_trace", str(trace), "--live", "--seconds", "60"],
        cwd=REPO,
    )
    try:
        term.wait_for("● live")
        term.wait_for("memdoc live  run.memdoc")
        term.press("q")
        assert term.exit_status() == 0
    finally:
        writer.terminate()
        writer.wait(timeout=10)


@needs_tmux
def test_ctrl_c_while_waiting_for_a_trace_exits_130_without_a_traceback(
    tmp_path: Path, terminal
) -> None:  # type: ignore[no-untyped-def]
    term = terminal(_memdoc("live", str(tmp_path / "later.memdoc")))
    term.wait_for("waiting for")
    term.press("C-c")
    assert term.exit_status() == 130
    assert "Traceback" not in term.screen()


def test_live_refuses_to_wait_in_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    done = run_memdoc("live", "no/such/run.memdoc", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "no/such/run.memdoc: no such file" in done.stderr.decode()


@needs_tmux
def test_ctrl_c_closes_the_dashboard_with_status_130(demo_trace: Path, terminal) -> None:  # type: ignore[no-untyped-def]
    term = terminal(_memdoc("live", str(demo_trace)))
    term.wait_for("▶ replay")
    term.press("C-c")
    assert term.exit_status() == 130
    assert "Press ctrl+q" not in term.screen()


@needs_tmux
def test_ctrl_c_stops_a_shell_loop_of_runs_as_it_would_with_python(
    tmp_path: Path, terminal
) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a shell loop that runs a program twice under memdoc
    program = tmp_path / "wait.py"
    program.write_text("import time\nprint('waiting', flush=True)\ntime.sleep(60)\n")
    run = _memdoc("run", "-q", "--force", "-o", str(tmp_path / "t.memdoc"), str(program))
    term = terminal(f"for i in 1 2; do {run}; echo after-run-$i; done")
    term.wait_for("waiting")

    # WHEN Ctrl-C interrupts the first run
    term.press("C-c")

    # THEN memdoc dies of SIGINT as its program did, so the shell ends the loop
    assert term.exit_status() == 130
    assert "after-run-1" not in term.screen()
