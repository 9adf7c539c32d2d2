"""nvidia-smi memory readings in one shape for every output format, and their trace records."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from memdoc.importers.build import TraceBuilder
from memdoc.trace.model import DeviceInfo, Metric, SeriesKey
from memdoc.units import parse_size

# What nvidia-smi prints where it has no value: "N/A", "[Not Supported]", "Not available in
# WDDM driver model", "[Insufficient Permissions]", "[Requested functionality has been ...]".
_NOT_A_VALUE = re.compile(
    r"^\[?(n/a|not supported|not available|insufficient permissions|unknown error|"
    r"gpu is lost|requested functionality)",
    re.IGNORECASE,
)


class Memory(NamedTuple):
    """A device's memory as nvidia-smi reports it (FB memory); None where it says N/A."""

    total_bytes: int | None = None
    used_bytes: int | None = None
    free_bytes: int | None = None
    reserved_bytes: int | None = None


NO_MEMORY = Memory()


@dataclass(frozen=True)
class GpuReading:
    """One device's memory at one instant. MIG instances carry `parent` (the physical GPU's
    position) and `mig_index`."""

    t_unix: float | None
    position: int  # the device's place in nvidia-smi's order (its index)
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    memory: Memory = NO_MEMORY
    driver_version: str | None = None
    parent: int | None = None
    mig_index: int | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class ProcessReading:
    """One process on a device at one instant, as nvidia-smi lists it."""

    t_unix: float | None
    pid: int
    command: str | None = None
    used_bytes: int | None = None
    position: int | None = None
    uuid: str | None = None
    bus_id: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    gpu_name: str | None = None


def size_or_none(text: str | None, default_unit: str = "MiB") -> int | None:
    """'1234 MiB' -> bytes; a bare number is in `default_unit`; N/A and the like -> None."""
    if text is None:
        return None
    text = text.strip()
    if not text or _NOT_A_VALUE.match(text):
        return None
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        text = f"{text} {default_unit}"
    return parse_size(text)


def int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def text_or_none(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return None if not text or _NOT_A_VALUE.match(text) else text


def parse_time(text: str | None) -> float | None:
    """nvidia-smi's timestamps carry no time zone: they are read as UTC."""
    if not text:
        return None
    text = " ".join(text.split())
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%a %b %d %H:%M:%S %Y"):
        try:
            return calendar.timegm(time.strptime(text, fmt)) + _fraction(text, fmt)
        except ValueError:
            continue
    return None


def _fraction(text: str, fmt: str) -> float:
    if "%f" not in fmt:
        return 0.0
    return float("0." + text.rsplit(".", 1)[1])


def add_readings(
    builder: TraceBuilder,
    gpus: Sequence[GpuReading],
    processes: Sequence[ProcessReading],
    fallback_t: float,
) -> None:
    """Devices, `gpu.used/free/total` per device and `gpu.proc_used` per pid, processes as
    not ours. Readings without a time get `fallback_t`."""
    named = _gpus_named_by_processes(gpus, processes)
    if named:
        builder.note(
            fallback_t,
            "The log names GPUs only by UUID or bus id, not by index: they are numbered in "
            "the order they appear.",
        )
    gpus = [*gpus, *named]
    index_of = _device_indices(gpus)
    for gpu in gpus:
        index = index_of[_gpu_key(gpu)]
        builder.device(
            DeviceInfo(
                index=index,
                name=gpu.name or f"GPU {index}",
                total_bytes=gpu.memory.total_bytes,
                uuid=gpu.uuid,
                parent_index=None if gpu.parent is None else index_of.get(("gpu", gpu.parent)),
                driver_version=gpu.driver_version,
            )
        )
        if gpu.memory == NO_MEMORY:
            continue
        builder.values(
            gpu.t_unix if gpu.t_unix is not None else fallback_t,
            {
                SeriesKey(Metric.GPU_USED, index): gpu.memory.used_bytes,
                SeriesKey(Metric.GPU_FREE, index): gpu.memory.free_bytes,
                SeriesKey(Metric.GPU_TOTAL, index): gpu.memory.total_bytes,
            },
        )
    for proc in processes:
        t = proc.t_unix if proc.t_unix is not None else fallback_t
        builder.process(proc.pid, t, (proc.command,) if proc.command else (), ours=False)
        device = _process_device(proc, gpus, index_of)
        if device is not None and proc.used_bytes is not None:
            builder.values(t, {SeriesKey(Metric.GPU_PROC_USED, device, proc.pid): proc.used_bytes})


def _gpus_named_by_processes(
    gpus: Sequence[GpuReading], processes: Sequence[ProcessReading]
) -> list[GpuReading]:
    """GPUs that only process rows name (a --query-compute-apps log on its own)."""
    known = {g.uuid for g in gpus} | {_bus(g.bus_id) for g in gpus}
    next_position = max((g.position for g in gpus), default=-1) + 1
    named: list[GpuReading] = []
    for proc in processes:
        if proc.position is not None or not (proc.uuid or proc.bus_id):
            continue
        if proc.uuid in known or (proc.bus_id and _bus(proc.bus_id) in known):
            continue
        named.append(
            GpuReading(
                t_unix=None,
                position=next_position,
                name=proc.gpu_name,
                uuid=proc.uuid,
                bus_id=proc.bus_id,
            )
        )
        known.update({proc.uuid, _bus(proc.bus_id)})
        next_position += 1
    return named


def _gpu_key(gpu: GpuReading) -> tuple[str, int]:
    if gpu.parent is not None and gpu.mig_index is not None:
        return ("mig", gpu.parent * 1000 + gpu.mig_index)
    return ("gpu", gpu.position)


def _device_indices(gpus: Iterable[GpuReading]) -> dict[tuple[str, int], int]:
    """Physical GPUs keep their position; MIG instances are numbered on after the last one,
    as memdoc's NVML collector numbers them."""
    keys = {_gpu_key(g) for g in gpus}
    physical = sorted(k for k in keys if k[0] == "gpu")
    index_of = {k: k[1] for k in physical}
    next_index = max((k[1] for k in physical), default=-1) + 1
    for key in sorted(k for k in keys if k[0] == "mig"):
        index_of[key] = next_index
        next_index += 1
    return index_of


def _process_device(
    proc: ProcessReading, gpus: Sequence[GpuReading], index_of: dict[tuple[str, int], int]
) -> int | None:
    for gpu in gpus:
        same_gpu = (
            (proc.uuid is not None and proc.uuid == gpu.uuid)
            or (proc.bus_id is not None and _bus(proc.bus_id) == _bus(gpu.bus_id))
            or (proc.position is not None and proc.position == gpu.position)
        )
        if not same_gpu or gpu.parent is not None:
            continue
        mig = _mig_of(proc, gpus, gpu.position)
        return index_of[_gpu_key(mig or gpu)]
    if proc.position is not None:
        return proc.position
    positions = {g.position for g in gpus if g.parent is None}
    return positions.pop() if len(positions) == 1 else None


def _mig_of(proc: ProcessReading, gpus: Sequence[GpuReading], parent: int) -> GpuReading | None:
    if proc.gpu_instance is None:
        return None
    for gpu in gpus:
        if (
            gpu.parent == parent
            and gpu.gpu_instance == proc.gpu_instance
            and gpu.compute_instance == proc.compute_instance
        ):
            return gpu
    return None


def _bus(bus_id: str | None) -> str | None:
    # XML writes 00000000:01:00.0, CSV sometimes 0000:01:00.0: compare the tail.
    return bus_id.lower()[-7:] if bus_id else None
