"""What `memdoc top` shows of the programs that run under memdoc, from their own traces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memdoc.recordings import Recording
from memdoc.trace import DeviceInfo, Metric, ProcessInfo, Trace, framework_metric
from memdoc.trace.model import FRAMEWORK_PREFIXES

# CUDA names a device by its index or by (a prefix of) its UUID; MIG instances too.
_UUID_PREFIXES = ("GPU-", "MIG-")


@dataclass(frozen=True)
class LiveRecording:
    """A recording announced on this machine, and its trace as read so far (None: not yet)."""

    recording: Recording
    trace: Trace | None


@dataclass(frozen=True)
class FrameworkUse:
    """One recorded process on one device: what its frameworks say they allocated and hold."""

    pid: int
    recorder_pid: int
    allocated_bytes: int | None
    reserved_bytes: int | None
    process: ProcessInfo | None = None


@dataclass(frozen=True)
class RecordingRow:
    """One recording for the "under memdoc" list."""

    pid: int  # the program's first recorded process; the recorder's until it is known
    command: str
    rss_bytes: int | None  # the program's whole process tree
    trace_path: Path
    running_s: float


def framework_device(trace: Trace, nvml_index: int, devices: Sequence[DeviceInfo]) -> int | None:
    """The index the run's frameworks give NVML device `nvml_index`: its place in the run's
    CUDA_VISIBLE_DEVICES, when set; None when the run cannot see that device."""
    visible = trace.header.env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nvml_index
    uuid = next((d.uuid for d in devices if d.index == nvml_index), None)
    for position, entry in enumerate(part.strip() for part in visible.split(",")):
        if entry.isdigit():
            if int(entry) == nvml_index:
                return position
        elif entry.startswith(_UUID_PREFIXES):
            if uuid is not None and uuid.startswith(entry):
                return position
        else:
            break  # CUDA ignores everything from the first entry it cannot read
    return None


def framework_use(
    recordings: Sequence[LiveRecording], devices: Sequence[DeviceInfo], nvml_index: int | None
) -> dict[int, FrameworkUse]:
    """{pid: use on the device} for every process the recordings own (the latest values)."""
    found: dict[int, FrameworkUse] = {}
    for live in recordings:
        trace = live.trace
        if trace is None:
            continue
        index = None if nvml_index is None else framework_device(trace, nvml_index, devices)
        for process in trace.processes(ours=True):
            allocated = _latest(trace, Metric.ALLOCATED, index, process.pid)
            reserved = _latest(trace, Metric.RESERVED, index, process.pid)
            found[process.pid] = FrameworkUse(
                process.pid, live.recording.pid, allocated, reserved, process
            )
    return found


def _latest(trace: Trace, quantity: str, device: int | None, pid: int) -> int | None:
    """Summed over the frameworks: one process may hold memory through two of them."""
    if device is None:
        return None
    values = []
    for fw in FRAMEWORK_PREFIXES:
        series = trace.series(framework_metric(fw, quantity), device, pid)
        last = series.last() if series is not None else None
        if last is not None:
            values.append(last[1])
    return int(sum(values)) if values else None


def recording_rows(
    recordings: Sequence[LiveRecording], wall_now: float
) -> tuple[RecordingRow, ...]:
    """One row per recording, oldest first."""
    rows = []
    for live in recordings:
        recording, trace = live.recording, live.trace
        programs = trace.processes(ours=True) if trace is not None else []
        rss = trace.series(Metric.HOST_RSS) if trace is not None else None
        last_rss = rss.last() if rss is not None else None
        rows.append(
            RecordingRow(
                pid=programs[0].pid if programs else recording.pid,
                command=" ".join(recording.command) or "?",
                rss_bytes=int(last_rss[1]) if last_rss is not None else None,
                trace_path=recording.trace_path,
                # Whole seconds: the list is redrawn once a second, not every frame.
                running_s=float(max(0, int(wall_now - recording.started_unix))),
            )
        )
    return tuple(rows)
