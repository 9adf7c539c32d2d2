"""Helpers for the framework collector tests: real programs under `memdoc.watch` in a fresh
interpreter, and a session that records what a collector reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from memdoc.trace import Trace, load_trace
from memdoc.trace.model import CollectorStatus, DeviceInfo, Event, ProcessInfo, SeriesKey

# Variables that change how a framework allocates: the test sets the ones it means.
_FRAMEWORK_ENV_PREFIXES = ("TF_", "XLA_", "JAX_", "PYTORCH_", "MEMDOC_", "CUDA_VISIBLE")


@dataclass
class WatchedRun:
    """What a program printed (its `RESULT {json}` line parsed) and the traces it wrote."""

    process: subprocess.CompletedProcess[str]
    result: dict[str, Any]
    folder: Path

    def trace(self, name: str = "run.memdoc") -> Trace:
        return load_trace(self.folder / name)


def run_program(
    folder: Path, source: str, *, env: Mapping[str, str] | None = None, timeout: float = 90
) -> WatchedRun:
    """Run `source` as a script in `folder`, in a fresh interpreter whose environment holds
    no framework settings but `env`. The program reports by printing `RESULT {json}`."""
    script = folder / "program.py"
    script.write_text(textwrap.dedent(source))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(_FRAMEWORK_ENV_PREFIXES)}
    full_env.pop("MEMDOC_AGENT", None)
    full_env.update(env or {})
    process = subprocess.run(
        [sys.executable, script.name],
        cwd=folder,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    result: dict[str, Any] = {}
    for line in process.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
    assert process.returncode == 0, process.stdout + process.stderr
    return WatchedRun(process, result, folder)


def events_of(trace: Trace, kind: str, **match: Any) -> list[Event]:
    """Events of `kind` whose data has every `match` item."""
    return [e for e in trace.events(kind) if all(e.data.get(k) == v for k, v in match.items())]


def last_status(trace: Trace, name: str) -> CollectorStatus:
    statuses = [s for s in trace.collectors() if s.name == name]
    assert statuses, f"no collector record named {name}"
    return statuses[-1]


@dataclass
class RecordingSession:
    """A `SessionHandle` that keeps what a collector reports, for tests of one collector."""

    events: list[Event] = field(default_factory=list)
    statuses: list[CollectorStatus] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        raise AssertionError("a collector returns its samples; it does not write them")

    def event(self, event: Event) -> None:
        self.events.append(event)

    def device(self, device: DeviceInfo) -> None:
        raise AssertionError("framework collectors do not describe GPUs (NVML does)")

    def process(self, process: ProcessInfo) -> None:
        raise AssertionError("framework collectors do not describe processes")

    def collector(self, status: CollectorStatus) -> None:
        self.statuses.append(status)

    def step(self, source: str = "user", **data: Any) -> int:
        self.steps.append({"source": source, **data})
        return len(self.steps)

    def record_exception(
        self,
        exc: BaseException,
        tb: TracebackType | None = None,
        *,
        where: str = "uncaught",
        context: Mapping[str, Any] | None = None,
    ) -> None:
        raise AssertionError("framework collectors report OOMs as events, not exceptions")

    def emit(self, kind: str, data: Mapping[str, Any] | None = None) -> None:
        self.events.append(Event(t=time.time(), kind=kind, data=dict(data or {})))

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [dict(e.data) for e in self.events if e.kind == kind]
