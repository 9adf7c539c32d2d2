"""Framework collectors that switch on once the program imports the framework, and their
shared parts: interval peaks without resets, host device indices, files saved beside the trace."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from memdoc.collectors.base import Collector, CollectorFailed, SessionHandle, Values
from memdoc.trace.model import CollectorStatus

SNAPSHOT_DIR_ENV = "MEMDOC_SNAPSHOT_DIR"


class FrameworkCollector(Collector, Protocol):
    """A framework collector: a `Collector` plus the two hooks the session may call.

    `oom_context(exc)` is asked, when the session records a memory error, for what this
    framework knew at that moment (allocator `stats`, a `live_arrays` summary...); it answers
    None for exceptions that are not its framework's. `on_mark(label, data)` sees every mark
    (a PyTorch allocation snapshot is saved on `mark(..., snapshot=True)`).
    """

    def oom_context(self, exc: BaseException) -> Mapping[str, Any] | None: ...

    def on_mark(self, label: str, data: Mapping[str, Any]) -> None: ...


def framework_collectors(
    *, trace_dir: Path | None = None, record_allocations: bool | None = None
) -> list[Collector]:
    """One lazy collector per supported framework (PyTorch, TensorFlow, JAX).

    Each stays silent until the program itself has imported its framework; memdoc never
    imports one. `trace_dir` is where snapshots and memory profiles go (unless
    MEMDOC_SNAPSHOT_DIR says otherwise) and what their paths in events are relative to.
    `record_allocations` turns on PyTorch allocation history (default: MEMDOC_RECORD_ALLOCATIONS).
    """
    files = ArtifactDir(trace_dir)

    def make_torch() -> FrameworkCollector:
        from memdoc.collectors.pytorch import TorchCollector

        return TorchCollector(files=files, record_allocations=record_allocations)

    def make_tf() -> FrameworkCollector:
        from memdoc.collectors.tensorflow import TensorFlowCollector

        return TensorFlowCollector()

    def make_jax() -> FrameworkCollector:
        from memdoc.collectors.jax import JaxCollector

        return JaxCollector(files=files)

    return [
        LazyFrameworkCollector("pytorch", "torch", make_torch),
        LazyFrameworkCollector("tensorflow", "tensorflow", make_tf),
        LazyFrameworkCollector("jax", "jax", make_jax),
    ]


def oom_context(collectors: Iterable[object], exc: BaseException) -> dict[str, Any]:
    """What every framework collector knew when `exc` happened, merged (first answer per key
    wins). For the session to add to an OOM event; never raises."""
    merged: dict[str, Any] = {}
    for collector in collectors:
        hook = getattr(collector, "oom_context", None)
        if hook is None:
            continue
        try:
            extra = hook(exc)
        except Exception:
            continue
        for key, value in (extra or {}).items():
            merged.setdefault(key, value)
    return merged


def notify_mark(collectors: Iterable[object], label: str, data: Mapping[str, Any]) -> None:
    """Tell every framework collector about a mark (for `mark(..., snapshot=True)`); never
    raises."""
    for collector in collectors:
        hook = getattr(collector, "on_mark", None)
        if hook is not None:
            with contextlib.suppress(Exception):
                hook(label, data)


def imported_module(name: str) -> Any | None:
    """The module if the program has finished importing it, else None. Never imports.

    A module sits in sys.modules from the start of its import; its spec says `_initializing`
    until the import is complete, and touching it before then can break the import.
    """
    module = sys.modules.get(name)
    if module is None:
        return None
    if getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


class LazyFrameworkCollector:
    """Waits, one `sys.modules` look-up a tick, for the program to import `module`, then
    starts the real collector (its probe is recorded under the same name) and delegates."""

    def __init__(self, name: str, module: str, factory: Callable[[], FrameworkCollector]) -> None:
        self.name = name
        self.module = module
        self._factory = factory
        self._session: SessionHandle | None = None
        self._real: FrameworkCollector | None = None
        self._given_up = False
        self._activating = threading.Lock()

    def probe(self) -> CollectorStatus:
        return CollectorStatus(
            name=self.name,
            available=True,
            reason=f"waiting for the program to import {self.module}",
        )

    def start(self, session: SessionHandle) -> None:
        self._session = session
        if not self._activate_if_imported():
            # Also at the import itself, not only at the next sample: a session without a
            # sampler thread samples at steps, which the framework's hooks report.
            from memdoc.collectors.loops.imports import when_imported

            when_imported(self.module, self._on_import)

    def sample(self, unix_t: float) -> Values:
        if self._real is None and (self._given_up or not self._activate_if_imported()):
            return {}
        assert self._real is not None
        return self._real.sample(unix_t)

    def close(self) -> None:
        if self._real is not None:
            self._real.close()
        elif self._session is not None and not self._given_up:
            self._session.collector(
                CollectorStatus(
                    name=self.name,
                    available=False,
                    reason=f"the program did not import {self.module}",
                )
            )

    def oom_context(self, exc: BaseException) -> Mapping[str, Any] | None:
        return self._real.oom_context(exc) if self._real is not None else None

    def on_mark(self, label: str, data: Mapping[str, Any]) -> None:
        if self._real is not None:
            self._real.on_mark(label, data)

    def _on_import(self, module: object) -> None:
        """The module's code has run (the import statement is returning): start now."""
        if self._session is not None and not self._given_up:
            self._activate(self._session)

    def _activate_if_imported(self) -> bool:
        session = self._session
        if session is None or imported_module(self.module) is None:
            return False
        return self._activate(session)

    def _activate(self, session: SessionHandle) -> bool:
        with self._activating:  # the import and the sampler thread may both get here
            if self._real is not None:
                return True
            return self._start_real(session)

    def _start_real(self, session: SessionHandle) -> bool:
        try:
            real = self._factory()
            status = real.probe()
        except Exception as exc:
            status = CollectorStatus(name=self.name, available=False, reason=repr(exc))
        else:
            if status.available:
                try:
                    real.start(session)
                except CollectorFailed as exc:
                    status = _unavailable(self.name, exc.reason, exc.hint)
                except Exception as exc:
                    status = _unavailable(self.name, f"could not start: {exc!r}")
                else:
                    self._real = real
        if self._real is None:
            self._given_up = True
            session.collector(status)
            return False
        session.collector(status)
        return True


def _unavailable(name: str, reason: str, hint: str | None = None) -> CollectorStatus:
    return CollectorStatus(name=name, available=False, reason=reason, hint=hint)


class IntervalPeak:
    """The highest value since the previous sample, derived without resetting the
    framework's own peak counter (the program may read it: a profiler must not move it).

    When the all-time peak rose since the last tick, the new all-time peak happened in this
    interval, so it is exact. Otherwise the interval's true peak lies below the all-time
    one and is not observable: max(current, previous current) is the best lower bound (a
    spike between samples that did not beat the all-time high is undercounted).
    A program that resets the peak itself makes it drop; the peak since that reset then
    lies in this interval too, so it still counts.
    """

    __slots__ = ("_alltime", "_current")

    def __init__(self) -> None:
        self._current: int | None = None
        self._alltime: int | None = None

    def update(self, current: int, alltime_peak: int | None) -> int:
        previous_current, previous_alltime = self._current, self._alltime
        self._current, self._alltime = current, alltime_peak
        peak = current if previous_current is None else max(current, previous_current)
        if alltime_peak is not None and (
            previous_alltime is None or alltime_peak != previous_alltime
        ):
            # First sample: the counter's peak since it started is this "interval".
            peak = max(peak, alltime_peak)
        return peak


def host_device_index(ordinal: int) -> int:
    """Series device index of a framework's host (CPU) device number `ordinal`: -1, -2, ..."""
    return -1 - ordinal


class ArtifactDir:
    """Where files saved during a run go (allocation snapshots, memory profiles), and the
    path an event gives for them: relative to the trace's folder when that is known."""

    def __init__(self, trace_dir: Path | None = None) -> None:
        self.trace_dir = trace_dir
        self._counter = itertools.count(1)

    @property
    def directory(self) -> Path:
        configured = os.environ.get(SNAPSHOT_DIR_ENV)
        if configured:
            return Path(configured)
        return self.trace_dir if self.trace_dir is not None else Path.cwd()

    def write(self, stem: str, suffix: str, data: bytes) -> str:
        """Write `data` atomically to a new file; returns the path to put in the event.

        Raises:
            OSError: the folder is not writable or the disk is full.
        """
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{stem}-{os.getpid()}-{next(self._counter)}{suffix}"
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".memdoc-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return self.event_path(path)

    def event_path(self, path: Path) -> str:
        if self.trace_dir is None:
            return str(path.resolve())
        try:
            return os.path.relpath(path.resolve(), self.trace_dir.resolve())
        except ValueError:  # another drive on Windows
            return str(path.resolve())
