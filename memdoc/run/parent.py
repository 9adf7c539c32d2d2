"""`memdoc run`'s parent: start the program, sample its process tree, write the one trace."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from memdoc import recordings
from memdoc.collectors.loops.handlers import FORWARD_ERRORS_ENV
from memdoc.collectors.registry import parent_collectors
from memdoc.files import open_output
from memdoc.metrics.identity import job_identity
from memdoc.run.channel import ENV_INTERVAL, ENV_SOCKET, AgentServer
from memdoc.run.rundir import SOCKET_NAME, create_run_dir, remove_stale_run_dirs
from memdoc.run.tee import stderr_tail
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
# Never forwarded (the kernel sends it to memdoc as the program ends): wakes the forwarding
# thread when the program has ended.
_WAKE = signal.SIGCHLD
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
    forward_errors: bool = False  # before Python 3.12: a global forward hook sees them
    output_log: Path | None = None  # --live: the program's output goes here
    extra_env: dict[str, str] = field(default_factory=dict)
    started: Callable[[int], None] | None = None  # told the program's PID once it runs
    # Imports the end of the run needs (the summary), done on a thread while the program
    # runs, so that a short program does not wait for them after it ended.
    warm_up: Callable[[], None] | None = None
    node_rank: int | None = None  # this node's place in a job on many nodes


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
        """The shell's view of how the program ended: its code, or 128+N for signal N (memdoc
        itself then dies of signal N, as the program did)."""
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
    header = header_for_this_process(
        options.display_command, interval_s=options.interval_s, mode="run"
    )
    run_id = job_run_id(os.environ, options.command)
    return replace(header, node_rank=options.node_rank, run_id=run_id)


def job_run_id(environ: Mapping[str, str], command: Sequence[str]) -> str | None:
    """The id every node's recording of one job shares: the job as its launcher names it,
    with the SLURM step (several `srun` steps of one job are several runs); None when no
    launcher names the job."""
    job = job_identity(environ, command).job
    step = environ.get("SLURM_STEP_ID")
    if job is not None and step and environ.get("SLURM_JOB_ID") == job:
        return f"{job}.{step}"
    return job


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
    sock_dir = create_run_dir()
    socket_path = str(sock_dir / SOCKET_NAME)
    # Listening now, accepting once started, by then writing through the forecasting sink.
    server = AgentServer(socket_path, writer)
    env = child_environment(socket_path, options.interval_s, dict(os.environ))
    env.update(options.extra_env)
    # Snapshots and memory profiles saved at an OOM go beside the trace.
    env["MEMDOC_SNAPSHOT_DIR"] = str(options.output.resolve().parent)
    if options.record_allocations:
        env["MEMDOC_RECORD_ALLOCATIONS"] = "1"
    if options.forward_errors:
        env[FORWARD_ERRORS_ENV] = "1"
    log = open_output(options.output_log, force=options.force) if options.output_log else None
    # The program writes to its own stderr; memdoc keeps the tail beside it, never in between.
    tail = stderr_tail(2) if log is None else None
    stdout: IO[bytes] | int | None = log
    stderr: IO[bytes] | int | None = subprocess.STDOUT if log is not None else None
    if tail is not None:
        stdout, stderr = tail.stdout_fd, tail.stderr_fd
    in_main = threading.current_thread() is threading.main_thread()
    # A signal that comes once the program runs but before the forwarding is set up (a
    # program that starts fast, a busy machine) is kept here and sent on to the program,
    # not raised in memdoc, which would then end and leave the program running.
    early: list[int] = []
    handlers = _keep_early_signals(early) if in_main else {}
    try:
        child = subprocess.Popen(options.command, env=env, stdout=stdout, stderr=stderr)
    except OSError as exc:
        _restore_handlers(handlers)
        if tail is not None:
            tail.program_started()
        server.stop(drain_s=0)
        writer.event(
            Event(t=time.time(), kind=EventKind.NOTE, data={"text": f"could not start: {exc}"})
        )
        writer.close(ExitInfo(t=time.time(), exit_code=127, reason="could not start the program"))
        shutil.rmtree(sock_dir, ignore_errors=True)
        raise
    if options.started is not None:
        options.started(child.pid)
    # Block the forwarded signals before memdoc starts any thread, so that only the
    # forwarding thread takes them (the child was started before, with the mask unblocked).
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED) if in_main else None
    _restore_handlers(handlers)
    for signum in early:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)
    try:
        # Made once the program runs, beside its start (memdoc's start is the program's wait).
        from memdoc.forecast.live import ForecastingSink

        sink = ForecastingSink(writer, start_unix=writer.start_unix)  # steps meet samples
        server.writer = sink
        with contextlib.suppress(Exception):  # housekeeping: folders of runs long gone
            remove_stale_run_dirs()
        server.start()
        if tail is not None:
            tail.program_started()
        _warm_up(options.warm_up, stderr=tail is not None)
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
        sink.settle(end_t)  # every step is in: the last forecast speaks for the whole run
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    exit_code, sig = (None, -returncode) if returncode < 0 else (returncode, None)
    if tail is not None:
        only = next(iter(server.agent_pids)) if len(server.agent_pids) == 1 else None
        _record_stderr_ooms(writer, tail.text(), in_process=server.oom_events, t=end_t, pid=only)
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


def _keep_early_signals(early: list[int]) -> dict[int, Any]:
    """Handlers for the forwarded signals that only note them in `early`; the handlers they
    replace, to restore."""
    saved: dict[int, Any] = {}
    for signum in _FORWARDED:
        with contextlib.suppress(OSError, ValueError):
            saved[signum] = signal.signal(signum, lambda got, frame: early.append(got))
    return saved


def _restore_handlers(saved: dict[int, Any]) -> None:
    for signum, handler in saved.items():
        with contextlib.suppress(OSError, ValueError, TypeError):
            signal.signal(signum, handler)


def _warm_up(work: Callable[[], None] | None, *, stderr: bool) -> None:
    """Import what the end of the run needs, on a daemon thread beside the program (started,
    like every thread of memdoc, with the forwarded signals blocked). What fails here is
    imported again where it is needed, and fails there as it would have."""

    def warm() -> None:
        with contextlib.suppress(Exception):
            if stderr:
                from memdoc.oom import parse_all

                parse_all("")  # loads the parsers the program's stderr is read with
            if work is not None:
                work()

    threading.Thread(target=warm, name="memdoc-warm-up", daemon=True).start()


def _record_stderr_ooms(
    writer: TraceWriter, text: str, *, in_process: int, t: float, pid: int | None = None
) -> None:
    """Memory errors the program printed: from processes without an agent, and the dumps
    (TensorFlow's BFC allocator state, XLA's buffer assignment) that only stderr carries.
    `pid` is the one Python process of the run, which printed them, when there was one."""
    if not text.strip():
        return  # the program printed nothing
    from memdoc.oom import parse_all

    for oom in parse_all(text):
        has_dump = oom.bfc_in_use_bytes is not None or bool(oom.xla_buffers)
        if in_process and not has_dump:
            continue  # the agent already recorded it, with stats and stack
        data: dict[str, object] = {"oom": oom.to_dict(), "source": "stderr"}
        if has_dump and oom.line is not None:
            lines = text.splitlines()
            data["dump"] = "\n".join(lines[max(0, oom.line - 1) : oom.line + 400])[:200_000]
        writer.event(Event(t=t, kind=EventKind.OOM, pid=pid, data=data))


def _wait_forwarding_signals(child: subprocess.Popen[bytes], *, forward: bool) -> int:
    """Wait for the child; pass on signals sent to memdoc, but not a terminal's Ctrl-C
    (which the program, in the same foreground process group, already received)."""
    if not forward:
        return child.wait()
    done = threading.Event()
    may_end = threading.Event()  # the thread stays until it can no longer be signalled

    def forward_loop() -> None:
        try:
            # Blocked in this thread only, and waited for with the forwarded ones: sent to
            # it once the program ended, it ends the wait at once instead of at its timeout.
            signal.pthread_sigmask(signal.SIG_BLOCK, {_WAKE})
            forward_until_done()
        finally:
            may_end.wait()

    def forward_until_done() -> None:
        while not done.is_set():
            info = signal.sigtimedwait((*_FORWARDED, _WAKE), 0.2)
            # A stop and continue (SIGSTOP, SIGCONT) can end the wait with no signal in it.
            if info is None or info.si_signo not in _FORWARDED:
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
        try:
            if thread.ident is not None:
                signal.pthread_kill(thread.ident, _WAKE)
        except OSError:
            pass
        finally:
            may_end.set()
        thread.join(1.0)
