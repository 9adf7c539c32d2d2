"""A program behaves the same with and without memdoc: output bytes, exit status, signals,
tracebacks, `__main__`, `sys.argv`, `sys.path[0]`, `sys.flags`, stdin, spawn pickling."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import memdoc_cmd


@dataclass(frozen=True)
class Program:
    source: str
    args: tuple[str, ...] = ()
    stdin: bytes = b""
    python_flags: tuple[str, ...] = ()  # run as `memdoc run -- python FLAGS prog.py`
    extra_files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


INTROSPECT = """
import os, sys
import __main__
print("name", __name__, "main is me", sys.modules["__main__"] is __main__)
print("file", __file__, "spec", __spec__, "package", __package__)
print("argv", sys.argv)
print("path0", sys.path[0])
print("flags", sys.flags)
print("executable", sys.executable)
print("cwd", os.getcwd())
print("builtins", type(__builtins__).__name__)
print("stdio", sys.stdin.isatty(), sys.stdout.isatty(), sys.stdout.encoding)
print("buffering", sys.stdout.line_buffering, sys.stderr.line_buffering)
"""

PROGRAMS = [
    pytest.param(Program(INTROSPECT, ("--lr", "3e-4", "ünï", "")), id="introspection"),
    pytest.param(
        Program(INTROSPECT, ("x",), python_flags=("-O", "-X", "utf8", "-W", "error")),
        id="python-flags",
    ),
    pytest.param(
        Program(INTROSPECT, (), python_flags=("-X", "dev")), id="dev-mode-warns-nothing-more"
    ),
    pytest.param(Program("import sys\nsys.exit(7)\n"), id="exit-code"),
    pytest.param(Program("import sys\nsys.exit('fatal: bad config')\n"), id="exit-with-message"),
    pytest.param(
        Program(
            """
            import sys
            print(sys.exit.__name__, sys.exit.__module__, sys.exit.__doc__ is not None)
            try:
                raise MemoryError("out of RAM")
            except MemoryError as exc:
                print("caught", exc, file=sys.stderr)
                sys.exit(3)
            """
        ),
        id="exit-while-handling-a-memory-error",
    ),
    pytest.param(
        Program(
            """
            import sys
            for attempt in range(3):
                try:
                    raise MemoryError(f"attempt {attempt}")
                except MemoryError as exc:
                    print("retrying after", exc)
            print("went on")
            """
        ),
        id="memory-errors-caught-and-survived",
    ),
    pytest.param(
        Program(
            """
            def inner(x):
                return {"a": 1}[x]
            print("before", flush=True)
            inner("b")
            """
        ),
        id="uncaught-exception-traceback",
    ),
    pytest.param(
        Program(
            """
            class Boom(Exception):
                pass
            try:
                raise ValueError("first")
            except ValueError as exc:
                raise Boom("second") from exc
            """
        ),
        id="chained-exception",
    ),
    pytest.param(Program("raise KeyboardInterrupt\n"), id="keyboard-interrupt"),
    pytest.param(
        Program(
            "import os, signal\nprint('bye', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\n"
        ),
        id="sigterm-self",
    ),
    pytest.param(
        Program("import os, signal\nos.kill(os.getpid(), signal.SIGUSR1)\n"),
        id="sigusr1-default-action",
    ),
    pytest.param(
        Program("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"), id="sigsegv-self"
    ),
    pytest.param(Program("import os\nos.abort()\n"), id="abort"),
    pytest.param(
        Program("import os\nprint('lost', end='')\nos._exit(3)\n"),
        id="os-exit-loses-buffered-output",
    ),
    pytest.param(
        Program(
            """
            import sys, hashlib
            data = sys.stdin.buffer.read()
            print(len(data), hashlib.sha256(data).hexdigest())
            sys.stderr.write("read it all\\n")
            """,
            stdin=bytes(range(256)) * 4000,
        ),
        id="reads-stdin",
    ),
    pytest.param(
        Program("import sys\nprint(sys.stdin.readline().strip()[::-1])\n", stdin=b"hello\nrest\n"),
        id="reads-a-line",
    ),
    pytest.param(
        Program(
            """
            import sys
            for i in range(2000):
                print(f"out {i}")
                print(f"err {i}", file=sys.stderr)
            sys.stdout.buffer.write(bytes(range(256)))
            print("é中\\udcff".encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
            """
        ),
        id="lots-of-output-and-binary",
    ),
    pytest.param(
        Program(
            """
            import threading
            def work():
                raise RuntimeError("in a thread")
            t = threading.Thread(target=work)
            t.start(); t.join()
            unnamed = threading.Thread(target=lambda: None)
            print("next thread name", unnamed.name, "threads now", threading.active_count() >= 1)
            """
        ),
        id="thread-exception-and-thread-names",
    ),
    pytest.param(
        Program(
            """
            import atexit, warnings
            atexit.register(lambda: print("atexit ran"))
            warnings.warn("careful", UserWarning)
            print("main done")
            """
        ),
        id="atexit-and-warnings",
    ),
    pytest.param(
        Program(
            """
            import multiprocessing as mp

            class Job:
                def __init__(self, n):
                    self.n = n
                def run(self):
                    return self.n * self.n

            def call(job):
                return type(job).__module__, job.run()

            if __name__ == "__main__":
                mp.set_start_method("spawn")
                with mp.Pool(2) as pool:
                    print(pool.map(call, [Job(i) for i in range(6)]))
                print("spawned children saw __mp_main__, pickled Job from __main__")
            """
        ),
        id="spawn-pickles-a-main-class",
    ),
    pytest.param(
        Program(
            "import sys\nprint('site says', getattr(sys, 'custom_site_marker', None))\n",
            extra_files={
                "site_dir/sitecustomize.py": "import sys\nsys.custom_site_marker = 'loaded'\n"
            },
            env={"PYTHONPATH": "site_dir"},
        ),
        id="users-own-sitecustomize-still-runs",
    ),
]


@dataclass(frozen=True)
class Outcome:
    stdout: bytes
    stderr: bytes
    status: int  # as a shell sees it: 128+N for signal N


def _shell_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _run(cmd: list[str], folder: Path, program: Program) -> Outcome:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC_") and k != "PYTHONPATH"}
    env.update(program.env)
    done = subprocess.run(
        cmd, cwd=folder, env=env, input=program.stdin, capture_output=True, timeout=120
    )
    return Outcome(done.stdout, done.stderr, _shell_status(done.returncode))


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_program_behaves_the_same_under_memdoc_run(tmp_path: Path, program: Program) -> None:
    (tmp_path / "prog.py").write_text(textwrap.dedent(program.source))
    for name, text in program.extra_files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    python = [sys.executable, *program.python_flags, "prog.py", *program.args]
    form = ["--", *python] if program.python_flags else python[1:]

    with ThreadPoolExecutor(2) as pool:  # side by side: the two runs share nothing
        plain_run = pool.submit(_run, python, tmp_path, program)
        watched_run = pool.submit(
            _run, memdoc_cmd("run", "-q", "-o", "t.memdoc", *form), tmp_path, program
        )
    plain, watched = plain_run.result(), watched_run.result()

    assert watched.stdout == plain.stdout
    assert watched.stderr == plain.stderr
    assert watched.status == plain.status
    assert (tmp_path / "t.memdoc").exists()
