"""`memdoc run`: the program runs exactly as without memdoc, and its memory is recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memdoc.trace import EventKind, Metric, load_trace
from tests.conftest import memdoc_cmd, run_memdoc

MiB = 1024**2

GROWING = textwrap.dedent(
    """
    import os, sys, time
    import memdoc
    print("name", __name__, "argv", sys.argv[1:], "path0", os.path.basename(sys.path[0]))
    blocks = []
    for i in range(6):
        blocks.append(bytearray(30 * 1024 * 1024))
        time.sleep(0.15)
        memdoc.step()
    print("done", len(blocks), flush=True)
    """
)

RAISES = textwrap.dedent(
    """
    def inner():
        raise ValueError("bad value 42")
    print("before")
    inner()
    """
)


def _plain(script: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, str(script.name), *args],
        cwd=script.parent,
        capture_output=True,
        timeout=60,
    )


def test_a_growing_script_runs_as_it_would_plain_and_its_rising_rss_and_steps_are_recorded(
    tmp_path: Path,
) -> None:
    script = tmp_path / "grow.py"
    script.write_text(GROWING)

    plain = _plain(script, "--lr", "3e-4")
    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "grow.py", "--lr", "3e-4", cwd=tmp_path)

    assert watched.stdout == plain.stdout
    assert b"name __main__ argv ['--lr', '3e-4']" in watched.stdout
    assert watched.returncode == plain.returncode == 0
    trace = load_trace(tmp_path / "t.memdoc")
    rss = trace.series(Metric.HOST_RSS)
    assert rss is not None and len(rss) >= 5
    assert max(rss.values) - rss.values[0] >= 100 * MiB
    assert len(trace.steps()) == 6
    assert trace.exit is not None and trace.exit.exit_code == 0


def test_a_script_that_raises_exits_1_prints_pythons_traceback_and_records_the_exception(
    tmp_path: Path,
) -> None:
    script = tmp_path / "boom.py"
    script.write_text(RAISES)

    plain = _plain(script)
    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "boom.py", cwd=tmp_path)

    assert watched.returncode == plain.returncode == 1
    assert watched.stdout == plain.stdout == b"before\n"
    assert watched.stderr == plain.stderr
    exceptions = load_trace(tmp_path / "t.memdoc").events(EventKind.EXCEPTION)
    assert [e.data["type"] for e in exceptions] == ["builtins.ValueError"]
    assert exceptions[0].data["message"] == "bad value 42"
    assert exceptions[0].data["stack"][-1].endswith(":inner")


def test_exit_codes_are_passed_through(tmp_path: Path) -> None:
    (tmp_path / "exit7.py").write_text("import sys; sys.exit(7)\n")

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "exit7.py", cwd=tmp_path)

    assert watched.returncode == 7
    trace = load_trace(tmp_path / "t.memdoc")
    assert trace.exit is not None and trace.exit.exit_code == 7


def test_module_form_runs_like_python_dash_m(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "-m", "pkg.train", "x", cwd=tmp_path)

    assert watched.returncode == 0
    assert watched.stdout == b"__main__ ['x']\n"


def test_the_arguments_after_a_module_are_the_modules_own(tmp_path: Path) -> None:
    # As with python -m: options memdoc also has (-o, --report, --help) go to the module.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nprint(sys.argv[1:])\n")
    args = ["--foo", "1", "-o", "mine.memdoc", "--report", "--help"]

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "-m", "pkg.train", *args, cwd=tmp_path)

    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == f"{args}\n".encode()
    assert (tmp_path / "t.memdoc").exists()
    assert not (tmp_path / "mine.memdoc").exists() and not list(tmp_path.glob("*.html"))


def test_a_folder_with_a_main_module_runs_like_python_folder(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("import sys\nprint('app', sys.argv[1:])\n")

    (tmp_path / "data").mkdir()

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "app", "x", cwd=tmp_path)
    refused = run_memdoc("run", "-q", "-o", "u.memdoc", "data", cwd=tmp_path)

    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == b"app ['x']\n"
    assert refused.returncode == 2 and b"data: no such file" in refused.stderr


def test_a_module_flag_without_a_module_is_a_usage_error(tmp_path: Path) -> None:
    watched = run_memdoc("run", "-m", cwd=tmp_path)

    assert watched.returncode == 2
    assert watched.stderr.decode().count("\n") <= 2 and b"Traceback" not in watched.stderr


def test_any_command_after_double_dash_is_followed_into_its_python_processes(
    tmp_path: Path,
) -> None:
    (tmp_path / "child.py").write_text(
        "import time\nx = bytearray(80 * 1024 * 1024)\ntime.sleep(1.5)\nprint('child ok')\n"
    )
    (tmp_path / "go.sh").write_text(f"#!/bin/sh\nexec {sys.executable} child.py\n")
    (tmp_path / "go.sh").chmod(0o755)

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "--", "./go.sh", cwd=tmp_path)

    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == b"child ok\n"
    trace = load_trace(tmp_path / "t.memdoc")
    agent_pids = {c.pid for c in trace.collectors() if c.name != "host" and c.name != "nvml"}
    assert trace.processes(ours=True)
    rss = trace.series(Metric.HOST_RSS)
    assert rss is not None and max(rss.values) >= 80 * MiB
    del agent_pids


def test_spawned_multiprocessing_and_subprocess_children_are_followed(tmp_path: Path) -> None:
    (tmp_path / "family.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing as mp, subprocess, sys, time

            def work():
                x = bytearray(60 * 1024 * 1024)
                time.sleep(2.0)

            if __name__ == "__main__":
                mp.set_start_method("spawn")
                p = mp.Process(target=work)
                p.start()
                q = subprocess.Popen([sys.executable, "-c",
                    "import time; x = bytearray(70 * 1024 * 1024); time.sleep(2.0)"])
                p.join(); q.wait()
                print("family ok", p.exitcode, q.returncode)
            """
        )
    )

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "family.py", cwd=tmp_path)

    assert watched.stdout == b"family ok 0 0\n", watched.stderr
    trace = load_trace(tmp_path / "t.memdoc")
    children = [
        p for p in trace.processes(ours=True) if p.ppid is not None and p.ppid != trace.header.pid
    ]
    per_pid = {
        k.pid: max(s.values)
        for k in trace.series_keys()
        if k.metric == Metric.HOST_RSS and k.pid is not None
        for s in [trace.series(k.metric, pid=k.pid)]
        if s is not None
    }
    assert sum(1 for rss in per_pid.values() if rss >= 60 * MiB) >= 2
    # Each Python child ran the agent: it announced itself over the channel.
    announced = {p.pid for p in children if p.command and "python" in p.command[0]}
    assert len(announced) >= 2


def _wait_for(path: Path, predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                if predicate(load_trace(path)):
                    return
            except Exception:
                pass
        time.sleep(0.1)
    raise AssertionError(f"{path} never satisfied the condition")


SLOW = "import time\nx = bytearray(50 * 1024 * 1024)\nwhile True:\n    time.sleep(0.05)\n"


def test_sigkill_of_the_program_is_reported_and_the_trace_keeps_every_older_sample(
    tmp_path: Path,
) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    proc = subprocess.Popen(
        memdoc_cmd("run", "-o", "t.memdoc", "slow.py"), cwd=tmp_path, stderr=subprocess.PIPE
    )
    trace_path = tmp_path / "t.memdoc"
    _wait_for(trace_path, lambda t: (s := t.series(Metric.HOST_RSS)) is not None and len(s) > 15)
    child = [p for p in load_trace(trace_path).processes(ours=True)][0]

    os.kill(child.pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=30)

    assert proc.returncode == -signal.SIGKILL
    trace = load_trace(trace_path)
    assert trace.exit is not None and trace.exit.signal == signal.SIGKILL
    rss = trace.series(Metric.HOST_RSS)
    assert rss is not None and rss.times[-1] >= trace.exit.t - 1.0
    assert b"SIGKILL" in stderr or b"killed" in stderr.lower()


def test_sigkill_of_memdoc_itself_leaves_a_trace_that_opens(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    proc = subprocess.Popen(memdoc_cmd("run", "-q", "-o", "t.memdoc", "slow.py"), cwd=tmp_path)
    trace_path = tmp_path / "t.memdoc"
    _wait_for(trace_path, lambda t: (s := t.series(Metric.HOST_RSS)) is not None and len(s) > 15)
    kill_time = time.time()
    child_pid = load_trace(trace_path).processes(ours=True)[0].pid

    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    os.kill(child_pid, signal.SIGKILL)  # the orphaned program runs on; stop it here

    trace = load_trace(trace_path)
    assert not trace.complete
    rss = trace.series(Metric.HOST_RSS)
    assert rss is not None
    last_abs = trace.header.created_unix + rss.times[-1]
    assert last_abs >= kill_time - 1.0


def test_sigterm_sent_to_memdoc_reaches_the_program(tmp_path: Path) -> None:
    (tmp_path / "term.py").write_text(
        textwrap.dedent(
            """
            import signal, sys, time
            def bye(signum, frame):
                print("got", signum, flush=True)
                sys.exit(0)
            signal.signal(signal.SIGTERM, bye)
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
            """
        )
    )
    proc = subprocess.Popen(
        memdoc_cmd("run", "-q", "-o", "t.memdoc", "term.py"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"

    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)

    assert out == f"got {int(signal.SIGTERM)}\n".encode()
    assert proc.returncode == 0


def test_a_program_killed_by_sigint_exits_like_python_does(tmp_path: Path) -> None:
    (tmp_path / "wait.py").write_text(
        "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n"
    )
    proc = subprocess.Popen(
        memdoc_cmd("run", "-q", "-o", "t.memdoc", "wait.py"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"

    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)

    # Python ends an uncaught KeyboardInterrupt by re-raising SIGINT, and so does memdoc.
    assert proc.returncode == -signal.SIGINT
    assert b"KeyboardInterrupt" in err


def test_a_child_that_exhausts_host_memory_under_rlimit_as_is_recorded_near_its_limit(
    tmp_path: Path,
) -> None:
    (tmp_path / "hog.py").write_text(
        textwrap.dedent(
            """
            import resource
            limit = 700 * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            blocks = []
            while True:
                blocks.append(bytearray(16 * 1024 * 1024))
            """
        )
    )

    watched = run_memdoc(
        "run", "-q", "-o", "t.memdoc", "--interval", "0.02", "hog.py", cwd=tmp_path
    )

    assert watched.returncode == 1
    assert b"MemoryError" in watched.stderr
    trace = load_trace(tmp_path / "t.memdoc")
    oom = trace.ending_oom()
    assert oom is not None and oom.framework == "host"
    (event,) = trace.oom_events()
    assert event.data["host"]["rlimit_as_bytes"] == 700 * MiB
    assert event.data["host"]["address_space_bytes"] >= 500 * MiB
    rss = trace.series(Metric.HOST_RSS)
    assert rss is not None and max(rss.values) >= 300 * MiB


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["run", "missing.py"], b"missing.py: no such file", id="missing-script"),
        pytest.param(["run"], b"nothing to run", id="nothing"),
        pytest.param(["run", "--", "no-such-command-xyz"], b"command not found", id="bad-command"),
        pytest.param(["run", "--interval", "0", "x.py"], b"--interval", id="bad-interval"),
        pytest.param(["run", "--interval", "inf", "x.py"], b"--interval", id="endless-interval"),
        pytest.param(["run", "--interval", "nan", "x.py"], b"--interval", id="nan-interval"),
        pytest.param(
            ["run", "--report", "--report-to", "r.html", "x.py"],
            b"not allowed with",
            id="two-report-options",
        ),
    ],
)
def test_bad_invocations_get_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: bytes
) -> None:
    result = run_memdoc(*args, cwd=tmp_path)

    assert result.returncode == 2
    assert message in result.stderr
    assert b"Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.memdoc")), "nothing was run, so no trace is left"


def test_an_existing_trace_is_not_overwritten_without_force(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print('hi')\n")
    (tmp_path / "t.memdoc").write_text("keep me")

    refused = run_memdoc("run", "-o", "t.memdoc", "ok.py", cwd=tmp_path)
    forced = run_memdoc("run", "-q", "--force", "-o", "t.memdoc", "ok.py", cwd=tmp_path)

    assert refused.returncode == 2 and b"--force" in refused.stderr
    assert forced.returncode == 0
    assert load_trace(tmp_path / "t.memdoc").exit is not None


def test_each_python_process_records_the_rank_its_launcher_gave_it(tmp_path: Path) -> None:
    (tmp_path / "ranks.py").write_text(
        textwrap.dedent(
            """
            import os, subprocess, sys
            procs = [
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"],
                                 env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)})
                for r in range(2)
            ]
            for p in procs:
                p.wait()
            """
        )
    )

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "ranks.py", cwd=tmp_path)

    assert watched.returncode == 0, watched.stderr
    ranks = {p.rank for p in load_trace(tmp_path / "t.memdoc").processes(ours=True)}
    assert {0, 1} <= ranks


def test_a_rank_set_inside_the_worker_after_start_is_recorded_too(tmp_path: Path) -> None:
    (tmp_path / "late.py").write_text(
        "import os, time\ntime.sleep(0.3)\n"
        "os.environ['LOCAL_RANK'] = '3'\nos.environ['RANK'] = '7'\ntime.sleep(1.0)\n"
    )

    watched = run_memdoc("run", "-q", "-o", "t.memdoc", "late.py", cwd=tmp_path)

    assert watched.returncode == 0, watched.stderr
    ranks = {(p.rank, p.local_rank) for p in load_trace(tmp_path / "t.memdoc").processes(ours=True)}
    assert (7, 3) in ranks


def test_a_signal_the_program_sends_memdoc_as_it_starts_reaches_the_program(
    tmp_path: Path,
) -> None:
    # Sent as soon as the program runs, maybe before memdoc forwards signals: it reaches
    # the program either way, and memdoc ends with it instead of leaving it running.
    (tmp_path / "early.py").write_text(
        "import os, signal, time\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(30)\n"
    )
    started = time.monotonic()
    run = run_memdoc("run", "-q", "-o", "t.memdoc", "early.py", cwd=tmp_path, timeout=25)

    assert run.returncode == -signal.SIGINT, run.stderr[-2000:]
    assert b"KeyboardInterrupt" in run.stderr
    assert time.monotonic() - started < 20
