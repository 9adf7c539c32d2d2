"""Driver-level GPU memory per device and per process, with the run's own processes marked."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import psutil

from memdoc.collectors.base import CollectorFailed, SessionHandle, Values
from memdoc.collectors.nvml_gate import (
    GpuProcess,
    NvmlGate,
    NvmlUnavailable,
    open_gate,
    refused_value,
)
from memdoc.trace.model import (
    CollectorStatus,
    DeviceInfo,
    EventKind,
    Metric,
    ProcessInfo,
    SeriesKey,
)

# Process lists cost milliseconds and take a driver lock that can stall the program:
# read them rarely, device memory (about 10 µs) on every tick.
PROCESS_INTERVAL_S = 3.0

OURS = "ours"
OTHER = "other"
UNRESOLVED = "unresolved"  # a PID that does not exist here: another PID namespace

_BROKEN_HINT = "the GPU may have fallen off the bus; see dmesg"
_T = TypeVar("_T")


def nspid_map(pids: Iterable[int], proc_root: Path = Path("/proc")) -> dict[int, int]:
    """{outermost-namespace pid: local pid} for processes that live in a nested PID
    namespace, read from the NSpid line of /proc/PID/status."""
    mapping: dict[int, int] = {}
    for pid in pids:
        try:
            status = (proc_root / str(pid) / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                ids = [int(x) for x in line.split()[1:]]
                if len(ids) > 1:
                    mapping[ids[0]] = pid
                break
    return mapping


def classify_pids(
    nvml_pids: Iterable[int],
    tree_pids: set[int],
    outer_to_local: dict[int, int],
    exists: Callable[[int], bool],
) -> dict[int, tuple[str, int]]:
    """For each PID NVML reports: (ours | other | unresolved, the PID as seen here).

    NVML reports PIDs in the driver's (host) namespace. When memdoc sees the host namespace
    they match directly or through NSpid; inside a container with its own PID namespace they
    may not exist here at all, which is said rather than guessed.
    """
    out: dict[int, tuple[str, int]] = {}
    for pid in nvml_pids:
        if pid in tree_pids:
            out[pid] = (OURS, pid)
        elif pid in outer_to_local:
            local = outer_to_local[pid]
            out[pid] = (OURS if local in tree_pids else OTHER, local)
        elif exists(pid):
            out[pid] = (OTHER, pid)
        else:
            out[pid] = (UNRESOLVED, pid)
    return out


class NvmlCollector:
    """Samples every device's used/free/total each tick and process lists every few seconds."""

    name = "nvml"

    def __init__(
        self,
        root_pid: int,
        *,
        gate_factory: Callable[[], NvmlGate] = open_gate,
        process_interval_s: float = PROCESS_INTERVAL_S,
    ) -> None:
        self.root_pid = root_pid
        self._gate_factory = gate_factory
        self._gate: NvmlGate | None = None
        self._devices: list[DeviceInfo] = []
        self._session: SessionHandle | None = None
        self._process_interval_s = process_interval_s
        self._last_processes = float("-inf")
        self._proc_values: Values = {}
        self._announced: set[int] = set()
        self._refused: set[tuple[str, int]] = set()
        self.unavailable: CollectorStatus | None = None

    def probe(self) -> CollectorStatus:
        try:
            self._gate = self._gate_factory()
        except NvmlUnavailable as exc:
            return CollectorStatus(self.name, False, reason=exc.reason, hint=exc.hint)
        return CollectorStatus(self.name, True, version=self._gate.driver_version())

    def start(self, session: SessionHandle) -> None:
        assert self._gate is not None, "probe() first"
        self._session = session
        self._devices = self._gate.devices()
        for device in self._devices:
            session.device(device)

    def sample(self, unix_t: float) -> Values:
        gate = self._gate
        if gate is None:
            return {}
        values: Values = {}
        try:
            for device in self._devices:
                mem = self._query(gate.memory, device.index, "device memory")
                if mem is None:
                    continue  # not available this time: missing, never 0
                values[SeriesKey(Metric.GPU_USED, device=device.index)] = mem.used_bytes
                values[SeriesKey(Metric.GPU_FREE, device=device.index)] = mem.free_bytes
                values[SeriesKey(Metric.GPU_TOTAL, device=device.index)] = mem.total_bytes
            if unix_t - self._last_processes >= self._process_interval_s:
                self._last_processes = unix_t
                self._proc_values = self._sample_processes(gate, unix_t)
        except CollectorFailed:
            raise
        except Exception as exc:
            raise CollectorFailed(f"NVML stopped answering: {exc}", _BROKEN_HINT) from None
        values.update(self._proc_values)
        return values

    def sample_processes_now(self, unix_t: float) -> Values:
        """Read process lists at once (on an OOM or at the end), whatever the cadence."""
        self._last_processes = float("-inf")
        return self.sample(unix_t)

    def _query(self, call: Callable[[int], _T], index: int, what: str) -> _T | None:
        """One NVML call for one device. A refusal (MIG, containers: no permission, not
        supported) makes that value not available and is said once; other devices and other
        values go on. Any other error means NVML is gone."""
        try:
            return call(index)
        except Exception as exc:
            reason = refused_value(exc)
            if reason is None:
                raise CollectorFailed(f"NVML stopped answering: {exc}", _BROKEN_HINT) from None
            self._say_refused(what, index, reason)
            return None

    def _say_refused(self, what: str, index: int, reason: str) -> None:
        if (what, index) in self._refused or self._session is None:
            return
        self._refused.add((what, index))
        self._session.emit(
            EventKind.NOTE,
            {"text": f"NVML refused {what} of GPU {index} ({reason}): not available there"},
        )

    def close(self) -> None:
        if self._gate is not None:
            self._gate.close()
            self._gate = None

    def _sample_processes(self, gate: NvmlGate, unix_t: float) -> Values:
        tree = _tree_pids(self.root_pid)
        values: Values = {}
        per_device: dict[int, list[GpuProcess]] = {}
        for device in self._devices:
            procs = self._query(gate.processes, device.index, "the process list")
            if procs is not None:
                per_device[device.index] = procs
        all_pids = {p.pid for procs in per_device.values() for p in procs}
        outer = nspid_map(tree) if all_pids - tree else {}
        classes = classify_pids(all_pids, tree, outer, psutil.pid_exists)
        for index, procs in per_device.items():
            for proc in procs:
                kind, local = classes[proc.pid]
                if proc.used_bytes is not None:
                    values[SeriesKey(Metric.GPU_PROC_USED, device=index, pid=local)] = (
                        proc.used_bytes
                    )
                self._announce(local, kind, unix_t)
        return values

    def _announce(self, pid: int, kind: str, unix_t: float) -> None:
        if pid in self._announced or self._session is None:
            return
        self._announced.add(pid)
        if kind == OURS:
            return  # the host collector announces the run's own processes
        command: tuple[str, ...] = ()
        user = None
        if kind == OTHER:
            try:
                proc = psutil.Process(pid)
                command = tuple(proc.cmdline())[:16]
                user = proc.username()
            except psutil.Error:
                pass
        else:
            command = ("<not visible here: another PID namespace>",)
        self._session.process(
            ProcessInfo(pid=pid, t=unix_t, command=command, ours=False, user=user)
        )


def _tree_pids(root_pid: int) -> set[int]:
    try:
        root = psutil.Process(root_pid)
        return {root_pid} | {c.pid for c in root.children(recursive=True)}
    except psutil.Error:
        return {root_pid}
