"""`memdoc run --live` as a person uses it, in a real terminal (tmux): Ctrl-C, q, an OOM."""

from __future__ import annotations

import re
import shlex
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO
from tests.tui.conftest import Terminal, needs_tmux

# Prints a numbered line five times a second until the file named by argv[1] appears.
TICKER = textwrap.dedent(
    """
    import os, sys, time
    try:
        for i in range(3000):
            if os.path.exists(sys.argv[1]):
                break
            print(f"tick {i}", flush=True)
            time.sleep(0.2)
        print("program finished", flush=True)
    except KeyboardInterrupt:
        print("program got KeyboardInterrupt", flush=True)
        raise
    """
)

RUNS_OUT = textwrap.dedent(
    """
    import time
    for i in range(5):
        print(f"tick {i}", flush=True)
        time.sleep(0.2)
    raise MemoryError("the program ran out of memory")
    """
)

# What only the dashboard draws: if any of it stays once the dashboard is gone, it is stray.
DASHBOARD_ONLY = ("OUT OF MEMORY", "q Quit", "│", "█", "▌", "program output (")
# A terminal's answer to a query the dashboard sent, echoed by the shell once it is gone.
TERMINAL_REPLY = re.compile(r"\^\[|\[\?\d+;\d+\$y|\[\d+;\d+R")


def _run_live(tmp_path: Path, *args: str) -> str:
    memdoc = shlex.join([sys.executable, "-m", "memdoc", "run", "--live", *args])
    return f"cd {shlex.quote(str(tmp_path))} && PYTHONPATH={shlex.quote(str(REPO))} {memdoc}"


def _last_tick(screen: str) -> int:
    return max(int(n) for n in re.findall(r"tick (\d+)", screen))


@needs_tmux
def test_ctrl_c_interrupts_the_program_and_memdoc_prints_its_summary(
    tmp_path: Path, terminal: type[Terminal]
) -> None:
    (tmp_path / "ticker.py").write_text(TICKER)
    term = terminal(_run_live(tmp_path, "-o", "run.memdoc", "ticker.py", "never"))
    term.wait_for("program output (run.log)")
    term.wait_for("tick 3")
    term.press("C-c")
    term.wait_for("memdoc: Ended by SIGINT")
    # The summary is printed line by line: wait for its last line, not its first.
    screen = term.wait_for("trace:  run.memdoc")
    assert "program got KeyboardInterrupt" in screen  # the program had its own Ctrl-C
    assert "KeyboardInterrupt" in screen.split("program got KeyboardInterrupt")[1]
    assert "Press ctrl+q" not in screen
    assert term.exit_status() == 130


@needs_tmux
def test_q_closes_the_dashboard_and_the_program_goes_on_with_its_output_shown(
    tmp_path: Path, terminal: type[Terminal]
) -> None:
    (tmp_path / "ticker.py").write_text(TICKER)
    stop = tmp_path / "stop"
    term = terminal(_run_live(tmp_path, "-o", "run.memdoc", "ticker.py", str(stop)))
    term.wait_for("program output (run.log)")
    term.wait_for("tick 3")
    term.press("q")
    term.wait_gone("q Quit")
    # The program runs on and its new lines keep arriving below the earlier ones.
    shown = _last_tick(term.wait_for("tick 3"))
    term.wait_for(f"tick {shown + 3}")
    assert not term.status_file.exists()
    stop.touch()
    screen = term.wait_for("memdoc: peak host")
    assert "program finished" in screen
    assert term.exit_status() == 0
    lines = screen.splitlines()
    ticks = [int(m.group(1)) for line in lines if (m := re.fullmatch(r"tick (\d+)", line))]
    assert ticks == list(range(ticks[0], ticks[-1] + 1))  # every line once, in order


@needs_tmux
def test_after_an_oom_banner_the_terminal_holds_only_the_output_and_the_summary(
    tmp_path: Path, terminal: type[Terminal]
) -> None:
    (tmp_path / "oom.py").write_text(RUNS_OUT)
    term = terminal(_run_live(tmp_path, "-o", "run.memdoc", "oom.py"))
    term.wait_for("OUT OF MEMORY")
    time.sleep(0.5)  # let the banner settle, as a person reads it
    term.press("q")
    assert term.exit_status() == 1
    screen = term.wait_for("memdoc: Ran out of host memory")
    assert "MemoryError: the program ran out of memory" in screen
    stray = [line for line in screen.splitlines() if any(s in line for s in DASHBOARD_ONLY)]
    assert stray == []
    assert TERMINAL_REPLY.search(screen) is None


def _memdoc_in(folder: Path) -> psutil.Process:
    """The `memdoc run --live` started in `folder`."""
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if "--live" in cmdline and "memdoc" in cmdline and proc.info["cwd"] == str(folder):
            return proc
    raise AssertionError(f"no memdoc run --live in {folder}")


def _ticking(
    tmp_path: Path, terminal: type[Terminal]
) -> tuple[Terminal, psutil.Process, psutil.Process]:
    """`memdoc run --live` on a program that ticks until stopped: the terminal, memdoc and
    the program, once the program's output shows."""
    (tmp_path / "ticker.py").write_text(TICKER)
    term = terminal(_run_live(tmp_path, "-o", "run.memdoc", "ticker.py", "never"))
    term.wait_for("tick 3")
    memdoc = _memdoc_in(tmp_path)
    (program,) = memdoc.children()
    return term, memdoc, program


@needs_tmux
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGQUIT], ids=["term", "quit"])
def test_a_signal_sent_to_memdoc_ends_the_program_and_memdoc_prints_its_summary(
    tmp_path: Path, terminal: type[Terminal], signum: signal.Signals
) -> None:
    # A scheduler cancelling the job signals memdoc, the process it started.
    term, memdoc, program = _ticking(tmp_path, terminal)

    memdoc.send_signal(signum)

    term.wait_for(f"memdoc: Ended by {signum.name}")
    term.wait_for("trace:  run.memdoc")  # the summary's last line
    assert term.exit_status() == 128 + signum
    assert not program.is_running()
    assert psutil.wait_procs([memdoc], timeout=10)[1] == []


@needs_tmux
def test_a_terminal_that_hangs_up_leaves_a_closed_trace_of_the_program(
    tmp_path: Path, terminal: type[Terminal]
) -> None:
    # An ssh session that drops: the terminal sends SIGHUP to memdoc and the program alike.
    from memdoc.trace import load_trace

    term, memdoc, program = _ticking(tmp_path, terminal)

    term.close()

    gone, alive = psutil.wait_procs([memdoc, program], timeout=20)
    assert alive == []
    trace = load_trace(tmp_path / "run.memdoc")
    assert trace.complete
    assert trace.exit is not None and trace.exit.signal == signal.SIGHUP
