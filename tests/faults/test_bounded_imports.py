"""Files other tools wrote, made to fill memory: profiler JSON that expands a thousand times,
or holds millions of empty events. Each is refused in one line, in bounded memory, also
under a memory limit."""

from __future__ import annotations

import gzip
import resource
import subprocess
from pathlib import Path

from tests.conftest import memdoc_cmd
from tests.faults.test_bounded_input import _measured
from tests.importers.snapshot_dicts import HTA

RLIMIT_AS_BYTES = 400 * 2**20


def _empty_events(count: int) -> bytes:
    return b'{"traceEvents":[' + b"{}," * count + b"{}]}"


def _gzipped(path: Path, data: bytes) -> Path:
    with gzip.open(path, "wb", compresslevel=9) as stream:
        stream.write(data)
    return path


def _under_a_memory_limit(*args: str) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (RLIMIT_AS_BYTES, RLIMIT_AS_BYTES))

    return subprocess.run(
        memdoc_cmd(*args), capture_output=True, text=True, timeout=120, preexec_fn=limit
    )


def test_a_64_kb_gzip_of_empty_profiler_events_is_refused_in_bounded_memory(
    tmp_path: Path,
) -> None:
    bomb = _gzipped(tmp_path / "trace.json.gz", _empty_events(20_000_000))
    assert bomb.stat().st_size < 100 * 1024

    status, stderr, peak_kib = _measured(
        tmp_path, "import", str(bomb), "-o", str(tmp_path / "out.memdoc")
    )

    assert status == 2, stderr
    (line,) = stderr.splitlines()
    assert line.startswith(f"memdoc: error: {bomb}: refused: it decompresses to more than ")
    assert peak_kib < 150 * 1024
    assert not (tmp_path / "out.memdoc").exists()


def test_a_1_mb_gzip_of_empty_events_under_a_memory_limit_gets_one_line(tmp_path: Path) -> None:
    bomb = _gzipped(tmp_path / "trace.json.gz", _empty_events(350_000_000))
    assert bomb.stat().st_size < 2 * 2**20

    done = _under_a_memory_limit("import", str(bomb), "-o", str(tmp_path / "out.memdoc"))

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("memdoc: error: ")
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr


def test_millions_of_events_that_would_not_fit_in_memory_are_refused_before_parsing(
    tmp_path: Path,
) -> None:
    many = tmp_path / "trace.json"
    many.write_bytes(_empty_events(13_000_000))

    done = _under_a_memory_limit("diagnose", str(many))

    assert done.returncode == 2, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"memdoc: error: {many}: refused: its 13,000,003 objects would take")
    assert "Traceback" not in done.stderr


def test_a_real_profiler_trace_still_imports_under_the_same_limit(tmp_path: Path) -> None:
    done = _under_a_memory_limit(
        "import", str(HTA / "df_index_resolver.json.gz"), "-o", str(tmp_path / "out.memdoc")
    )

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.memdoc").stat().st_size > 0
