"""`memdoc run`'s parent: start the program, sample its process tree, write the one trace."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from memdoc import recordings
from memdoc.collectors.registry import parent_collectors
from memdoc.forecast.live import ForecastingSink
from memdoc.run.channel import ENV_INTERVAL, ENV_SOCKET, AgentServer
from memdoc.run.tee import StreamTee, same_file, should_tee
from memdoc.session import Session, header_for_this_process
from memdoc.trace.model import (
    Event,
    EventKind,
    ExitInfo,
    Header,
    ProcessInfo,
)
from memdoc.trace.writer import TraceWriter

BOOTSTRAP_DIR = str(Path(__file__).resolve().parent / "bootstrap")
_FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
# si_code of a signal the kernel sent (a terminal's Ctrl-C reaches the whole foreground
# process group, the program included, so such a signal is not forwarded twice).
_SI_KERNEL = 0x80


@dataclass
class RunOptions:
    """What `memdoc run` was asked to do."""

    command: list[str]
    display_command: list[str]
    output: Path
    interval_s: float = 0.1
    force: bool = False
    nvml: bool = True
    record_allocations: bool = False
    output_log: Path | None = None  # --live: the program's output goes here
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunResult:
    """How the program ended, and what memdoc wrote."""

    exit_code: int | None
    signal: int | None
    trace_path: Path
    writer_error: str | None
    agents: int

    @property
    def status(self) -> int:
        """What `memdoc run` exits with: the program's code, or 128+N for signal N."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code if self.exit_code is not None else 1


def child_environment(socket_path: str, interval_s: float, base: dict[str, str]) -> dict[str, str]:
    """The program's environment plus what lets the agent start in every Python process."""
    env = dict(base)
    env[ENV_SOCKET] = socket_path
    env[ENV_INTERVAL] = repr(interval_s)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + existing if existing else "")
    return env


def _header(options: RunOptions) -> Header:
    return header_for_this_process(
        options.display_command, interval_s=options.interval_s, mode="run"
    )


def run_program(options: RunOptions) -> RunResult:
    """Run the program to its end under observation. The program's stdin, stdout, stderr,
    signals and exit status are its own; memdoc's failures never stop it."""
    writer = TraceWriter(options.output, _header(options), force=options.force)
    entry = recordings.register(options.output, options.display_command)
    try:
        return _run_recorded(options, writer)
    finally:
        recordings.unregister(entry)


def _run_recorded(options: RunOptions, writer: TraceWriter) -> RunResult:
    sock_dir = tempfile.mkdtemp(prefix="memdoc-")
    socket_path = os.path.join(sock_dir, "agent.sock")
    sink = ForecastingSink(writer, start_unix=writer.start_unix)  # where steps meet samples
    server = AgentServer(socket_path, sink)  # listening now, accepting once started
    env = child_environment(socket_path, options.interval_s, dict(os.environ))
    env.update(options.extra_env)
    # Snapshots and memory profiles saved at an OOM go beside the trace.
    env["MEMDOC_SNAPSHOT_DIR"] = str(options.output.resolve().parent)
    if options.record_allocations:
        env["MEMDOC_RECORD_ALLOCATIONS"] = "1"
    log: IO[bytes] | None = open(options.output_log, "wb") if options.output_log else None  # noqa: SIM115
    tee = (
        StreamTee(2) if log is None and should_tee(2) else None
    )  # started once signals are blocked
    stdout: IO[bytes] | int | None = log
    stderr: IO[bytes] | int | None = subprocess.STDOUT if log is not None else None
    if tee is not None:
        stderr = tee.write_fd
        if same_file(1, 2):  # `> log 2>&1`: one pipe keeps the program's own ordering
            stdout = tee.write_fd
    try:
        child = subprocess.Popen(options.command, env=env, stdout=stdout, stderr=stderr)
    except OSError as exc:
        if tee is not None:
            tee.close_write_end()
        server.stop(drain_s=0)
        writer.event(
            Event(t=time.time(), kind=EventKind.NOTE, data={"text": f"could not start: {exc}"})
        )
        writer.close(ExitInfo(t=time.time(), exit_code=127, reason="could not start the program"))
        shutil.rmtree(sock_dir, ignore_errors=True)
        raise
    if tee is not None:
        tee.close_write_end()
    # Block the forwarded signals before memdoc starts any thread, so that only the
    # forwarding thread takes them (the child was started before, with the mask unblocked).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED) if in_main else None
    try:
        server.start()
        if tee is not None:
            tee.start()
        writer.process(
            ProcessInfo(
                pid=child.pid, t=time.time(), ppid=os.getpid(), command=tuple(options.command)
            )
        )
        session = Session(
            sink, parent_collectors(child.pid, nvml=options.nvml), interval_s=options.interval_s
        )
        session.start()
        returncode = _wait_forwarding_signals(child, forward=in_main)
        end_t = time.time()
        session.stop()
        server.stop(drain_s=1.0)
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    exit_code, sig = (None, -returncode) if returncode < 0 else (returncode, None)
    if tee is not None:
        tee.join()
        _record_stderr_ooms(writer, tee.text(), in_process=server.oom_events, t=end_t)
    writer.event(
        Event(
            t=end_t,
            kind=EventKind.PROCESS_EXIT,
            pid=child.pid,
            data={"code": exit_code, "signal": sig},
        )
    )
    writer.close(ExitInfo(t=end_t, exit_code=exit_code, signal=sig))
    if log is not None:
        log.close()
    shutil.rmtree(sock_dir, ignore_errors=True)
    return RunResult(exit_code, sig, options.output, writer.error, len(server.agent_pids))


def _record_stderr_ooms(writer: TraceWriter, text: str, *, in_process: int, t: float) -> None:
    """Memory errors the program printed: from processes without an agent, and the dumps
    (TensorFlow's BFC allocator state, XLA's buffer assignment) that only stderr carries."""
    from memdoc.oom import parse_all

    for oom in parse_all(text):
        has_dump = oom.bfc_in_use_bytes is not None or bool(oom.xla_buffers)
        if in_process and not has_dump:
            continue  # the agent already recorded it, with stats and stack
        data: dict[str, object] = {"oom": oom.to_dict(), "source": "stderr"}
        if has_dump and oom.line is not None:
            lines = text.splitlines()
            data["dump"] = "\n".join(lines[max(0, oom.line - 1) : oom.line + 400])[:200_000]
        writer.event(Event(t=t, kind=EventKind.OOM, data=data))


def _wait_forwarding_signals(child: subprocess.Popen[bytes], *, forward: bool) -> int:
    """Wait for the child; pass on signals sent to memdoc, but not a terminal's Ctrl-C
    (which the program, in the same foreground process group, already received)."""
    if not forward:
        return child.wait()
    done = threading.Event()

    def forward_loop() -> None:
        while not done.is_set():
            info = signal.sigtimedwait(_FORWARDED, 0.2)
            if info is None:
                continue
            from_terminal = info.si_code == _SI_KERNEL or (
                info.si_signo == signal.SIGINT and info.si_pid == 0
            )
            if not from_terminal:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(info.si_signo)

    thread = threading.Thread(target=forward_loop, name="memdoc-signals", daemon=True)
    thread.start()
    try:
        return child.wait()
    finally:
        done.set()
        thread.join(1.0)
