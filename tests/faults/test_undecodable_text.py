"""Arguments, folders and environment values that are not UTF-8: kept, shown, never fatal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from memdoc.trace import load_trace
from memdoc.trace.model import allowlisted_env
from tests.conftest import memdoc_cmd
from tests.faults.cli_in_process import memdoc

NOT_UTF8 = b"caf\xe9"  # Latin-1 bytes, as an old file name or a locale-less shell gives them
AS_PYTHON_HOLDS_IT = os.fsdecode(NOT_UTF8)  # 'caf\udce9'
PROGRAM = "import sys\nprint('ran with', ascii(sys.argv[1:]))\n"
WATCHING_PROGRAM = (
    "import sys, memdoc\n"
    "with memdoc.watch('watched.memdoc'):\n"
    "    print('watched', ascii(sys.argv[1:]))\n"
)
ENV_NAME = "PYTORCH_CUDA_ALLOC_CONF"  # recorded in the trace header


def _folder(tmp_path: Path) -> bytes:
    folder = os.fsencode(tmp_path) + b"/" + NOT_UTF8
    os.mkdir(folder)
    return folder


def _run(args: list[str | bytes], cwd: bytes) -> subprocess.CompletedProcess[bytes]:
    env: dict[bytes, bytes] = {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    env.pop(b"MEMDOC_AGENT", None)
    env[ENV_NAME.encode()] = b"expandable_segments:True," + NOT_UTF8
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, timeout=120)  # type: ignore[arg-type]


def test_run_keeps_undecodable_arguments_folder_and_environment(tmp_path: Path) -> None:
    assert ENV_NAME in allowlisted_env({ENV_NAME: "x"})
    folder = _folder(tmp_path)
    (tmp_path / AS_PYTHON_HOLDS_IT / "prog.py").write_text(PROGRAM)

    done = _run([*memdoc_cmd("run", "--no-nvml", "-o", "t.memdoc"), "prog.py", NOT_UTF8], folder)

    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert b"ran with ['caf\\udce9']" in done.stdout
    trace = load_trace(os.fsdecode(folder + b"/t.memdoc"))
    assert trace.header.command[-1] == AS_PYTHON_HOLDS_IT
    assert trace.header.cwd is not None and trace.header.cwd.endswith(AS_PYTHON_HOLDS_IT)
    assert trace.header.env[ENV_NAME].endswith(AS_PYTHON_HOLDS_IT)


def test_diagnose_shows_undecodable_bytes_as_replacement_characters(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (tmp_path / AS_PYTHON_HOLDS_IT / "prog.py").write_text(PROGRAM)
    _run([*memdoc_cmd("run", "-q", "--no-nvml", "-o", "t.memdoc"), "prog.py", NOT_UTF8], folder)

    said = memdoc("diagnose", os.fsdecode(folder + b"/t.memdoc"))

    assert said.status == 0, said.stderr
    assert "caf\ufffd" in said.stdout


def test_an_undecodable_argument_leaves_a_whole_trace_not_an_empty_one(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (tmp_path / AS_PYTHON_HOLDS_IT / "prog.py").write_text(PROGRAM)
    args = [*memdoc_cmd("run", "-q", "--no-nvml", "-o", "t.memdoc"), "prog.py", NOT_UTF8]

    first = _run(args, folder)
    again = _run(args, folder)

    assert first.returncode == 0, first.stderr
    assert again.returncode == 2  # the first run's trace is whole, so not overwritten...
    assert b"exists" in again.stderr
    assert load_trace(os.fsdecode(folder + b"/t.memdoc")).complete  # ...and it is whole


def test_watch_keeps_undecodable_arguments(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (tmp_path / AS_PYTHON_HOLDS_IT / "prog.py").write_text(WATCHING_PROGRAM)

    done = _run([sys.executable, "prog.py", NOT_UTF8], folder)

    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    trace = load_trace(os.fsdecode(folder + b"/watched.memdoc"))
    assert AS_PYTHON_HOLDS_IT in trace.header.command
