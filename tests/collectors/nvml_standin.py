"""A stand-in for the NVML call gate, fed with values recorded on real GPUs."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from memdoc.collectors.nvml_gate import GpuMemory, GpuProcess
from memdoc.trace.model import DeviceInfo
from memdoc.units import parse_size


@dataclass
class RecordedDevice:
    info: DeviceInfo
    memory: GpuMemory
    processes: list[GpuProcess] = field(default_factory=list)


class RecordedGate:
    """Imitates `memdoc.collectors.nvml_gate.NvmlGate` (the real one wraps pynvml) by
    answering from recorded values. It fails loudly on a device it does not know, can be
    told to break after N memory reads, like a GPU that falls off the bus, and to raise a
    given error on one call for one device (`refuse[("processes", 1)] = pynvml error`), as
    NVML does where it refuses a value (MIG, containers)."""

    def __init__(self, devices: list[RecordedDevice], driver: str = "590.44.01") -> None:
        self._devices = devices
        self._driver = driver
        self.break_after_reads: int | None = None
        self.memory_reads = 0
        self.process_reads = 0
        self.closed = False
        self.refuse: dict[tuple[str, int], Exception] = {}

    def driver_version(self) -> str | None:
        return self._driver

    def devices(self) -> list[DeviceInfo]:
        return [d.info for d in self._devices]

    def memory(self, index: int) -> GpuMemory:
        self.memory_reads += 1
        if ("memory", index) in self.refuse:
            raise self.refuse["memory", index]
        if self.break_after_reads is not None and self.memory_reads > self.break_after_reads:
            raise RuntimeError("NVMLError_GpuIsLost: GPU is lost")
        return self._device(index).memory

    def processes(self, index: int) -> list[GpuProcess]:
        self.process_reads += 1
        if ("processes", index) in self.refuse:
            raise self.refuse["processes", index]
        return list(self._device(index).processes)

    def close(self) -> None:
        self.closed = True

    def _device(self, index: int) -> RecordedDevice:
        for device in self._devices:
            if device.info.index == index:
                return device
        raise AssertionError(f"the stand-in knows no device {index}")


def _mib(text: str | None) -> int:
    value = parse_size((text or "").strip())
    assert value is not None, text
    return value


def gate_from_nvidia_smi_xml(path: Path) -> RecordedGate:
    """Devices, memory and processes exactly as an `nvidia-smi -q -x` file recorded them."""
    root = ET.parse(path).getroot()
    driver = root.findtext("driver_version")
    devices = []
    for index, gpu in enumerate(root.findall("gpu")):
        fb = gpu.find("fb_memory_usage")
        assert fb is not None
        reserved = fb.findtext("reserved")
        memory = GpuMemory(
            total_bytes=_mib(fb.findtext("total")),
            used_bytes=_mib(fb.findtext("used")),
            free_bytes=_mib(fb.findtext("free")),
            reserved_bytes=_mib(reserved) if reserved else None,
        )
        procs = [
            GpuProcess(int(p.findtext("pid") or 0), _mib(p.findtext("used_memory")))
            for p in gpu.iter("process_info")
        ]
        info = DeviceInfo(
            index=index,
            name=gpu.findtext("product_name") or "?",
            total_bytes=memory.total_bytes,
            uuid=gpu.findtext("uuid"),
            driver_version=driver,
        )
        devices.append(RecordedDevice(info, memory, procs))
    return RecordedGate(devices, driver or "")
