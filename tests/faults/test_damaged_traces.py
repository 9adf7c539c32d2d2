"""Damaged, hostile and foreign trace files: every reader salvages or refuses with one line."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from memdoc.errors import TraceError
from memdoc.trace import (
    SCHEMA_VERSION,
    DeviceInfo,
    Event,
    EventKind,
    ExitInfo,
    Header,
    OomInfo,
    SeriesKey,
    Trace,
    TraceWriter,
    load_trace,
)
from tests.conftest import run_memdoc
from tests.faults.cli_in_process import memdoc

START = 1_764_687_600.0
MiB = 1024**2


def _write_small_trace(path: Path) -> None:
    """A real trace in miniature: a device, host and framework series, steps, an OOM, the end."""
    header = Header(
        version=SCHEMA_VERSION,
        created_unix=START,
        memdoc_version="test",
        command=("train.py",),
        pid=10,
    )
    writer = TraceWriter(path, header)
    writer.device(DeviceInfo(0, "NVIDIA A100-SXM4-80GB", 80 * 1024**3))
    for i in range(24):
        values = {
            SeriesKey("host.rss"): 900 * MiB + i * MiB,
            SeriesKey("gpu.used", 0): 20_000 * MiB + 300 * i * MiB,
            SeriesKey("torch.allocated", 0, 11): 18_000 * MiB + 300 * i * MiB,
            SeriesKey("torch.reserved", 0, 11): 19_000 * MiB + 300 * i * MiB,
        }
        writer.samples(START + 0.1 * (i + 1), values)
        if i % 4 == 3:
            writer.event(
                Event(
                    START + 0.1 * (i + 1),
                    EventKind.STEP,
                    11,
                    {"step": i // 4 + 1, "source": "optimizer"},
                )
            )
    oom = OomInfo(
        framework="pytorch",
        device=0,
        requested_bytes=2 * 1024**3,
        total_bytes=80 * 1024**3,
        message="CUDA out of memory",
    )
    writer.event(
        Event(START + 2.5, EventKind.OOM, 11, {"oom": oom.to_dict(), "stack": ["train.py:9:step"]})
    )
    writer.close(ExitInfo(START + 2.6, exit_code=1))


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("small") / "t.memdoc"
    _write_small_trace(path)
    return path.read_bytes()


def _series_values(trace: Trace) -> dict[SeriesKey, list[float]]:
    return {
        key: list(s.values)
        for key in trace.series_keys()
        if (s := trace.series(key.metric, key.device, key.pid))
    }


def _is_prefix_of(part: Trace, whole: Trace) -> bool:
    full = _series_values(whole)
    return all(values == full[key][: len(values)] for key, values in _series_values(part).items())


def _load_or_refuse(path: Path) -> Trace | None:
    """The trace, or None when refused with memdoc's one-line error. Anything else escapes."""
    try:
        return load_trace(path)
    except TraceError as exc:
        assert "\n" not in exc.message and exc.message
        return None


def test_a_trace_cut_at_every_byte_opens_as_a_prefix_of_itself_once_its_header_is_whole(
    tmp_path: Path, small_trace: bytes
) -> None:
    whole = load_trace_bytes(tmp_path / "whole.memdoc", small_trace)
    header_end = small_trace.index(b"\n")
    cut = tmp_path / "cut.memdoc"
    previous_values = 0
    for size in range(len(small_trace) + 1):
        cut.write_bytes(small_trace[:size])
        trace = _load_or_refuse(cut)
        if size < header_end:
            assert trace is None, f"a header cut at byte {size} was accepted"
            continue
        assert trace is not None, f"cut at byte {size}: refused, though its header is whole"
        assert _is_prefix_of(trace, whole), f"cut at byte {size}: values that were never written"
        assert trace.values_read >= previous_values
        previous_values = trace.values_read
    assert previous_values == whole.values_read


def load_trace_bytes(path: Path, data: bytes) -> Trace:
    path.write_bytes(data)
    return load_trace(path)


def test_a_compressed_trace_cut_at_every_byte_opens_as_a_prefix_or_is_refused(
    tmp_path: Path, small_trace: bytes
) -> None:
    whole = load_trace_bytes(tmp_path / "whole.memdoc", small_trace)
    packed = gzip.compress(small_trace, mtime=0)
    cut = tmp_path / "cut.memdoc.gz"
    for size in range(len(packed) + 1):
        cut.write_bytes(packed[:size])
        trace = _load_or_refuse(cut)
        if trace is not None:
            assert _is_prefix_of(trace, whole), f"cut at byte {size}"
    assert load_trace_bytes(cut, packed).values_read == whole.values_read


def _flipped(data: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    damaged = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        bit = rng.randrange(len(damaged) * 8)
        damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


def test_random_bit_flips_in_a_trace_are_salvaged_or_refused_in_one_line(
    tmp_path: Path, small_trace: bytes
) -> None:
    path = tmp_path / "flipped.memdoc"
    opened = 0
    for seed in range(400):
        path.write_bytes(_flipped(small_trace, seed))
        opened += _load_or_refuse(path) is not None
    assert opened > 200  # most flips land in sample lines, which are skipped alone


def test_random_bit_flips_in_a_compressed_trace_are_salvaged_or_refused_in_one_line(
    tmp_path: Path, small_trace: bytes
) -> None:
    packed = gzip.compress(small_trace, mtime=0)
    path = tmp_path / "flipped.memdoc.gz"
    for seed in range(400):
        path.write_bytes(_flipped(packed, seed))
        _load_or_refuse(path)


@pytest.mark.parametrize("seed", range(40))
def test_random_bytes_are_refused_as_not_a_trace(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "noise.memdoc"
    path.write_bytes(rng.randbytes(rng.choice([1, 7, 100, 4096, 70_000])))

    assert _load_or_refuse(path) is None


def test_a_deeply_nested_line_is_skipped_like_any_damaged_line(
    tmp_path: Path, small_trace: bytes
) -> None:
    header, rest = small_trace.split(b"\n", 1)
    path = tmp_path / "nested.memdoc"
    path.write_bytes(header + b"\n" + b"[" * 100_000 + b"\n" + rest)

    trace = _load_or_refuse(path)

    assert trace is not None and trace.warnings


def test_a_line_over_16_mib_is_skipped_and_the_lines_after_it_are_read(
    tmp_path: Path, small_trace: bytes
) -> None:
    header, rest = small_trace.split(b"\n", 1)
    path = tmp_path / "huge.memdoc"
    path.write_bytes(header + b"\n" + b'["' + b"x" * (17 * MiB) + b'"]\n' + rest)

    trace = load_trace(path)

    assert trace.warnings
    assert trace.values_read == load_trace_bytes(tmp_path / "whole.memdoc", small_trace).values_read


def test_a_header_line_over_16_mib_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge-header.memdoc"
    huge = {
        "type": "header",
        "format": "memdoc-trace",
        "version": 1,
        "created_unix": 0,
        "memdoc_version": "x" * (17 * MiB),
    }
    path.write_text(json.dumps(huge) + "\n")

    assert _load_or_refuse(path) is None


def _header(**fields: object) -> bytes:
    record = {
        "type": "header",
        "format": "memdoc-trace",
        "version": 1,
        "created_unix": START,
        "memdoc_version": "t",
    }
    record.update(fields)
    return (json.dumps(record) + "\n").encode()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param(_header(version=SCHEMA_VERSION + 1), "newer", id="newer-version"),
        pytest.param(_header(version=999_999), "newer", id="far-future-version"),
        pytest.param(_header(version="1"), "version", id="version-as-text"),
        pytest.param(_header(version=None), "version", id="no-version"),
        pytest.param(_header(format="other-trace"), "not a memdoc trace", id="other-format"),
        pytest.param(b"[1, 2, 3]\n", "not a memdoc trace", id="array-first"),
        pytest.param(b"null\n", "not a memdoc trace", id="null-first"),
        pytest.param(b"", "empty", id="empty"),
        pytest.param(b"\n\n\n", "trace", id="blank-lines"),
        pytest.param(b"\xff\xfe\x00garbage\n", "not a memdoc trace", id="not-utf8"),
    ],
)
def test_a_file_that_is_not_a_readable_trace_is_refused_with_what_is_wrong(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "bad.memdoc"
    path.write_bytes(content)

    with pytest.raises(TraceError) as refused:
        load_trace(path)

    assert says in refused.value.message
    assert "\n" not in refused.value.message


# -- the commands over damaged traces ---------------------------------------------------------


def _damaged_variants(small_trace: bytes) -> dict[str, bytes]:
    header, rest = small_trace.split(b"\n", 1)
    variants = {
        "cut-in-header": small_trace[: len(header) // 2],
        "cut-mid-line": small_trace[: len(small_trace) * 2 // 3],
        "random-bytes": random.Random(1).randbytes(3000),
        "newer-version": _header(version=SCHEMA_VERSION + 1) + rest,
        "huge-line": header + b"\n" + b"x" * (17 * MiB) + b"\n" + rest,
        "hostile-strings": header + b"\n" + _hostile_records() + rest,
    }
    variants.update({f"flipped-{seed}": _flipped(small_trace, seed) for seed in range(12)})
    return variants


def _hostile_records() -> bytes:
    """Records whose strings are markup and code: a report shows them, never runs them."""
    script = "</script><script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    records = [
        {
            "type": "process",
            "pid": 66,
            "t": 0.1,
            "command": [script, "{{7*7}}", "${7*7}"],
            "ours": True,
        },
        {"type": "event", "t": 0.2, "kind": "mark", "pid": 66, "data": {"label": script}},
        {"type": "event", "t": 0.3, "kind": "note", "data": {"text": script}},
        {"type": "device", "index": 3, "name": script, "total_bytes": 1024},
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_diagnose_and_report_salvage_or_refuse_every_damaged_trace_in_one_line(
    tmp_path: Path, small_trace: bytes
) -> None:
    problems = []
    for name, content in _damaged_variants(small_trace).items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "t.memdoc").write_bytes(content)
        diagnosed = memdoc("diagnose", str(folder / "t.memdoc"))
        reported = memdoc("report", str(folder / "t.memdoc"), "-o", str(folder / "t.html"))
        for command, said in (("diagnose", diagnosed), ("report", reported)):
            if said.status not in (0, 3) and not said.one_clear_error():
                problems.append(f"{name}: {command} exit {said.status} said {said.stderr!r}")
        files = sorted(p.name for p in folder.iterdir())
        if reported.status != 0 and files != ["t.memdoc"]:
            problems.append(f"{name}: a refused report left {files}")
        if reported.status == 0 and b"<script>document.title" in (folder / "t.html").read_bytes():
            problems.append(f"{name}: the report carries the trace's markup unescaped")
    assert problems == []


def test_a_report_refused_for_a_damaged_trace_writes_nothing_and_keeps_an_existing_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "t.memdoc").write_bytes(b"not a trace at all\n")
    (tmp_path / "t.html").write_text("yesterday's report")

    said = memdoc("report", str(tmp_path / "t.memdoc"), "-o", str(tmp_path / "t.html"), "--force")

    assert said.status == 2 and said.one_clear_error()
    assert (tmp_path / "t.html").read_text() == "yesterday's report"
    assert sorted(os.listdir(tmp_path)) == ["t.html", "t.memdoc"]


@pytest.mark.parametrize("command", ["diagnose", "report"])
def test_the_real_cli_refuses_a_damaged_trace_with_one_line_and_exit_2(
    tmp_path: Path, command: str
) -> None:
    (tmp_path / "t.memdoc").write_bytes(_header(version=SCHEMA_VERSION + 1))

    done = run_memdoc(command, "t.memdoc", cwd=tmp_path)

    assert done.returncode == 2
    assert b"Traceback" not in done.stderr
    assert done.stderr.decode().startswith("memdoc: error: ")
    assert sorted(os.listdir(tmp_path)) == ["t.memdoc"]


# -- records of the right kind with fields of the wrong type ------------------------------------

WELL_FORMED: dict[str, Any] = {
    "series": {"type": "series", "id": 50, "metric": "torch.allocated", "device": 0, "pid": 11},
    "samples": [0.35, 0, 123, 1, 456],
    "event": {
        "type": "event",
        "t": 0.4,
        "kind": "oom",
        "pid": 11,
        "data": {"oom": {"framework": "pytorch", "device": 0}},
    },
    "process": {
        "type": "process",
        "pid": 12,
        "t": 0.1,
        "ppid": 10,
        "command": ["a"],
        "ours": True,
        "user": "u",
    },
    "end": {"type": "end", "t": 2.0, "exit_code": 1, "signal": None, "reason": "r"},
    "device": {
        "type": "device",
        "index": 1,
        "name": "X",
        "total_bytes": 1000,
        "uuid": "u",
        "parent_index": None,
    },
    "collector": {
        "type": "collector",
        "name": "nvml",
        "available": False,
        "t": 0.1,
        "pid": 10,
        "reason": "r",
        "hint": "h",
    },
}
WRONG_VALUES = ["s", [1], None, 10**30, -5, True]


def _mistyped(kind: str, header: bytes) -> list[tuple[str, bytes]]:
    """(label, lines) for every field of a record kind set to every wrong value."""
    if kind == "header":
        record = json.loads(header)
        fields = [k for k in record if k not in ("type", "format", "version")]
        return [
            (f"header.{f}={json.dumps(w)}", json.dumps({**record, f: w}).encode())
            for f in fields
            for w in WRONG_VALUES
        ]
    record = WELL_FORMED[kind]
    if isinstance(record, list):
        return [
            (
                f"samples[{i}]={json.dumps(w)}",
                json.dumps(record[:i] + [w] + record[i + 1 :]).encode(),
            )
            for i in range(len(record))
            for w in WRONG_VALUES
        ]
    fields = [k for k in record if k != "type"]
    return [
        (f"{kind}.{f}={json.dumps(w)}", json.dumps({**record, f: w}).encode())
        for f in fields
        for w in WRONG_VALUES
    ]


@pytest.mark.parametrize(
    "kind",
    [
        *(
            pytest.param(k, id=k)
            for k in (
                "series",
                "samples",
                "event",
                "process",
                "end",
                "device",
                "collector",
                "header",
            )
        ),
    ],
)
def test_a_record_with_a_wrongly_typed_field_never_breaks_diagnose_or_report(
    tmp_path: Path, small_trace: bytes, kind: str
) -> None:
    header, rest = small_trace.split(b"\n", 1)
    trace, html = tmp_path / "t.memdoc", tmp_path / "t.html"
    problems = []
    for label, line in _mistyped(kind, header):
        content = line + b"\n" + rest if kind == "header" else header + b"\n" + line + b"\n" + rest
        trace.write_bytes(content)
        for args in (
            ("diagnose", str(trace)),
            ("diagnose", "--json", str(trace)),
            ("report", str(trace), "-o", str(html), "--force"),
        ):
            try:
                said = memdoc(*args)
            except Exception as exc:
                problems.append(f"{label}: memdoc {args[0]} raised {type(exc).__name__}: {exc}")
                continue
            if said.status not in (0, 3) and not said.one_clear_error():
                problems.append(f"{label}: memdoc {args[0]} exit {said.status}: {said.stderr!r}")
    assert problems == []
