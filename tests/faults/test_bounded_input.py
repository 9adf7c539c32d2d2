"""Any input takes bounded time and memory: endless files, pipes, devices, gzip bombs."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.errors import TraceError
from memdoc.trace import (
    SCHEMA_VERSION,
    Event,
    EventKind,
    ExitInfo,
    Header,
    SeriesKey,
    TraceWriter,
    codec,
    load_trace,
)
from memdoc.trace.reader import load_trace_lines
from tests.conftest import memdoc_cmd, run_memdoc
from tests.faults.cli_in_process import memdoc
from tests.report.traces import write_oom_run

OOM_LINE = (
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 226.00 MiB. GPU 0 has a "
    b"total capacity of 15.58 GiB of which 71.25 MiB is free.\n"
)
TWO_GB = 2 * 2**30
# The peak is the process's own (VmHWM): getrusage's ru_maxrss survives exec, so a child of
# a large pytest process would report the parent's size instead of its own.
_MEASURED = """
import runpy, sys
def own_peak_kib():
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
sys.argv = ["memdoc", *sys.argv[1:]]
try:
    runpy.run_module("memdoc", run_name="__main__")
finally:
    print("peak_kib", own_peak_kib(), file=sys.stderr)
"""


def _measured(tmp_path: Path, *args: str, stdin: int | None = None) -> tuple[int, str, int]:
    """Run `memdoc ARGS`; return its status, its stderr and its peak RSS in KiB."""
    script = tmp_path / "measured.py"
    script.write_text(_MEASURED)
    done = subprocess.run(
        [sys.executable, str(script), *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    peak_kib = int(done.stderr.rsplit("peak_kib", 1)[1])
    return done.returncode, done.stderr.rsplit("peak_kib", 1)[0], peak_kib


def test_explain_reads_only_the_tail_of_a_huge_file(tmp_path: Path) -> None:
    # GIVEN a 2 GB log (sparse: zeros) whose error is at the end
    log = tmp_path / "huge.log"
    with open(log, "wb") as stream:
        stream.truncate(TWO_GB)
        stream.seek(TWO_GB)
        stream.write(OOM_LINE)

    status, stderr, peak_kib = _measured(tmp_path, "explain", str(log))

    assert status == 3, stderr  # 3: a memory problem found
    assert peak_kib < 300 * 1024


def test_explain_finds_the_error_at_the_end_of_a_huge_file(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with open(log, "wb") as stream:
        stream.truncate(TWO_GB)
        stream.seek(TWO_GB)
        stream.write(OOM_LINE)

    done = run_memdoc("explain", "--json", str(log))

    assert done.returncode == 3, done.stderr  # 3: a memory problem found
    assert b'"requested_bytes": 236978176' in done.stdout


@pytest.mark.parametrize(
    "path", [pytest.param("/dev/zero", id="dev-zero"), pytest.param("/dev/null", id="dev-null")]
)
def test_explain_refuses_a_device_in_one_line(path: str) -> None:
    said = memdoc("explain", path)

    assert said.status == 2
    assert said.one_clear_error()
    assert "not a regular file" in said.stderr


def test_explain_refuses_a_fifo_instead_of_waiting_on_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    done = subprocess.run(memdoc_cmd("explain", str(fifo)), capture_output=True, timeout=60)

    assert done.returncode == 2
    assert b"not a regular file" in done.stderr
    assert b"Traceback" not in done.stderr


def test_explain_keeps_only_the_tail_of_an_endless_stdin(tmp_path: Path) -> None:
    # GIVEN 2 GiB of zeros, then the error, on stdin
    feeder = subprocess.Popen(
        ["sh", "-c", f"head -c {TWO_GB} /dev/zero; printf '%s' \"$0\"", OOM_LINE.decode()],
        stdout=subprocess.PIPE,
    )
    assert feeder.stdout is not None
    try:
        status, stderr, peak_kib = _measured(
            tmp_path, "explain", "--json", "-", stdin=feeder.stdout.fileno()
        )
    finally:
        feeder.stdout.close()
        feeder.wait(timeout=60)

    assert status == 3, stderr  # 3: a memory problem found
    assert peak_kib < 300 * 1024


def _gzip_bomb(path: Path, first_line: bytes, repeated: bytes, total_bytes: int) -> Path:
    """A gzip file that decompresses to `first_line`, then `repeated` up to `total_bytes`."""
    block = repeated * max(1, (1 << 20) // len(repeated))
    with gzip.open(path, "wb", compresslevel=6) as stream:
        stream.write(first_line)
        for _ in range(total_bytes // len(block)):
            stream.write(block)
    return path


def _header_line() -> bytes:
    header = Header(version=SCHEMA_VERSION, created_unix=1764687600.0, memdoc_version="0.1.0")
    return codec.encode_header(header).encode() + b"\n"


@pytest.mark.parametrize(
    ("repeated", "total_bytes"),
    [
        pytest.param(b"\0" * 4096, TWO_GB, id="zeros"),
        # Valid lines a thousand times smaller packed: past the limit, read no further.
        pytest.param(b"[0.5,0,1]\n", 64 * 2**20, id="sample-lines"),
    ],
)
def test_a_gzip_bomb_trace_is_refused_in_one_line_with_bounded_memory(
    tmp_path: Path, repeated: bytes, total_bytes: int
) -> None:
    series = codec.encode_series(0, SeriesKey("host.rss")).encode() + b"\n"
    bomb = _gzip_bomb(tmp_path / "bomb.memdoc", _header_line() + series, repeated, total_bytes)
    assert bomb.stat().st_size < 20 * 2**20

    status, stderr, peak_kib = _measured(tmp_path, "diagnose", str(bomb))

    assert status == 2, stderr
    assert "memdoc: error: " in stderr and "decompresses to more than" in stderr
    assert "Traceback" not in stderr
    assert peak_kib < 400 * 1024


def test_a_trace_of_too_many_lines_is_refused_in_one_line() -> None:
    lines = iter([_header_line(), *([b"[0.5,0,1]\n"] * 20)])

    with pytest.raises(TraceError, match="more than 10 lines"):
        load_trace_lines(lines, max_lines=10)


def test_a_real_compressed_trace_still_loads(tmp_path: Path) -> None:
    plain = write_oom_run(tmp_path / "run.memdoc")
    packed = tmp_path / "run.memdoc.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))

    assert load_trace(packed).values_read == load_trace(plain).values_read


# What reading a trace may keep per step event: a few columns of numbers (about 50 bytes).
# Kept as an object with a dict each, a step took about 670 bytes: a 1.4 MB gzip trace of
# 300,000 steps took 200 MB to read.
STEP_BYTES_BOUND = 100
# The peak of reading alone, measured in a process of its own (VmHWM reset after the imports).
_LOAD_MEASURED = """
import sys
from memdoc.trace import load_trace
def kib(field):
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith(field)))
before = kib("VmRSS:")
try:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak counts from here
except OSError:
    pass
trace = load_trace(sys.argv[1])
print(len(trace.steps()), kib("VmHWM:") - before)
"""


def _step_trace(path: Path, steps: int) -> Path:
    """A gzip trace of `steps` optimizer steps, written by the real writer."""
    header = Header(version=SCHEMA_VERSION, created_unix=1764687600.0, memdoc_version="0.1.0")
    plain = path.with_suffix("")
    writer = TraceWriter(plain, header)
    for number in range(1, steps + 1):
        t = header.created_unix + number * 0.01
        writer.event(Event(t, EventKind.STEP, 4243, {"step": number, "source": "optimizer"}))
    writer.close(ExitInfo(header.created_unix + steps * 0.01 + 1.0, exit_code=0))
    with open(plain, "rb") as source, gzip.open(path, "wb") as packed:
        shutil.copyfileobj(source, packed)
    plain.unlink()
    return path


def test_reading_steps_costs_memory_per_step_kept_not_per_line(tmp_path: Path) -> None:
    # GIVEN a gzip trace of 200,000 steps (1 MB packed, 19 MB of lines)
    steps = 200_000
    trace = _step_trace(tmp_path / "steps.memdoc.gz", steps)

    # WHEN it is read in a process of its own
    script = tmp_path / "load.py"
    script.write_text(_LOAD_MEASURED)
    done = subprocess.run(
        [sys.executable, str(script), str(trace)], capture_output=True, text=True, timeout=120
    )

    # THEN every step is there, and reading kept a few dozen bytes for each
    assert done.returncode == 0, done.stderr
    read, added_kib = map(int, done.stdout.split())
    assert read == steps
    assert added_kib * 1024 / steps < STEP_BYTES_BOUND
