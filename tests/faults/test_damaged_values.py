"""NaN, Infinity, wrongly typed values and integers beyond 64 bits, in every field of a trace
and of a snapshot: a salvaged result or one clear line, never a traceback."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memdoc.errors import MemdocError
from memdoc.importers.safe_pickle import load_plain_pickle
from memdoc.report.data import ReportData
from memdoc.report.html import write_report
from memdoc.rules.engine import diagnose_run
from memdoc.trace import load_trace
from memdoc.trace.reader import Run
from memdoc.tui.feed import Feed
from memdoc.tui.sources import ReplaySource
from memdoc.tui.view import ViewRequest
from tests.faults.cli_in_process import memdoc
from tests.report.traces import write_oom_run
from tests.tui.conftest import ManualClock, no_rules

# JSON texts put where a value was; NaN and Infinity are what Python's json reads and writes.
HOSTILE_VALUES = [
    "NaN",
    "Infinity",
    "-Infinity",
    '"x"',
    "[]",
    "{}",
    "[[1,2,3]]",
    str(2**70),
    "-1",
    "null",
    "true",
    "1e308",
]
SNAPSHOT = Path(__file__).resolve().parent.parent / (
    "fixtures/importers/torch-snapshots-flexgen/oom_snapshot.pickle"
)
HOSTILE_SNAPSHOT_VALUES = [2**70, -(2**70), 2**63, float("nan"), float("inf"), "x", "caf\udce9"]
HOSTILE_SNAPSHOT_VALUES += [None, [], {}, True]


def _field_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key and index path in a decoded JSON value, containers included."""
    if isinstance(value, dict):
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        yield from _field_paths(child, (*prefix, key))


def _with_value(line: bytes, path: tuple[Any, ...], json_value: str) -> bytes:
    record = json.loads(line)
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "@hostile@"
    return json.dumps(record).replace('"@hostile@"', json_value).encode()


def _one_line_of_each_kind(lines: list[bytes]) -> list[int]:
    seen: set[tuple[str, ...]] = set()
    picked = []
    for i, line in enumerate(lines):
        record = json.loads(line)
        kind = ("samples",) if isinstance(record, list) else (record["type"], record.get("kind"))
        if kind not in seen:
            seen.add(kind)
            picked.append(i)
    return picked


def _damaged_traces(folder: Path) -> Iterator[tuple[str, Path]]:
    lines = write_oom_run(folder / "clean.memdoc", steps=3).read_bytes().splitlines()
    for i in _one_line_of_each_kind(lines):
        for path in _field_paths(json.loads(lines[i])):
            for value in HOSTILE_VALUES:
                damaged = [*lines[:i], _with_value(lines[i], path, value), *lines[i + 1 :]]
                out = folder / "damaged.memdoc"
                out.write_bytes(b"\n".join(damaged) + b"\n")
                yield f"line {i + 1} {'.'.join(map(str, path))} = {value}", out


def _every_view(trace_path: Path, with_html: bool) -> None:
    """Load, diagnose, build the report data and a dashboard frame: what every view uses."""
    trace = load_trace(trace_path)
    run = Run([trace])
    findings = diagnose_run(run)
    ReportData.from_run(run, findings, title="damaged")
    feed = Feed(ReplaySource(trace, clock=ManualClock(), paused=True, start_s=2.0), rules=no_rules)
    frame = feed.next_frame(ViewRequest())
    assert frame.view.status.error is None, frame.view.status.error
    if with_html:
        html = trace_path.with_suffix(".html")
        html.unlink(missing_ok=True)
        write_report([trace_path], html)


def test_every_hostile_value_in_every_trace_field_is_salvaged(tmp_path: Path) -> None:
    """Each field of one line of each kind gets each hostile value, in turn."""
    failures = []
    for case, path in _damaged_traces(tmp_path):
        try:
            _every_view(path, with_html=case.endswith(("= NaN", "= 1180591620717411303424")))
        except MemdocError:
            pass  # refused: the CLI says it in one line
        except Exception as exc:  # collected: the assertion lists every case that failed
            failures.append(f"{case}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures[:20])


def _snapshot_paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> Iterator[Any]:
    """Paths into the first item of every list: one of each field, not every record."""
    if depth > 5:
        return
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from _snapshot_paths(child, (*prefix, key), depth + 1)
    elif isinstance(value, list) and value:
        yield (*prefix, 0)
        yield from _snapshot_paths(value[0], (*prefix, 0), depth + 1)


@pytest.mark.parametrize("value", HOSTILE_SNAPSHOT_VALUES, ids=repr)
def test_a_hostile_value_in_any_snapshot_field_imports_or_is_refused_in_one_line(
    tmp_path: Path, value: Any
) -> None:
    snapshot = load_plain_pickle(SNAPSHOT)
    failures = []
    for path in _snapshot_paths(snapshot):
        damaged = copy.deepcopy(snapshot)
        target = damaged
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        pickled = tmp_path / "damaged.pickle"
        pickled.write_bytes(pickle.dumps(damaged, protocol=4))
        out = tmp_path / "damaged.memdoc"
        out.unlink(missing_ok=True)
        try:
            said = memdoc("import", str(pickled), "-o", str(out))
            if said.status == 0:
                said = memdoc("report", str(out), "-o", str(tmp_path / "r.html"), "--force")
            if said.status != 0 and not said.one_clear_error():
                failures.append(f"{path}: {said.stderr}")
        except Exception as exc:  # collected: the assertion lists every path that failed
            failures.append(f"{path}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures[:20])
