"""Read `nvidia-smi -q -x` XML (schemas v10 to v13, and logs of several documents from `-l`)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from memdoc.errors import InputError
from memdoc.importers.smi_readings import (
    NO_MEMORY,
    GpuReading,
    Memory,
    ProcessReading,
    int_or_none,
    parse_time,
    size_or_none,
    text_or_none,
)

_DOCUMENT = re.compile(r"<nvidia_smi_log\b.*?</nvidia_smi_log>", re.DOTALL)


def looks_like_smi_xml(head: str) -> bool:
    return "<nvidia_smi_log" in head


def parse_smi_xml(text: str, name: str) -> tuple[list[GpuReading], list[ProcessReading]]:
    """Every document in the text (`nvidia-smi -q -x -l N` appends one per interval).

    Raises:
        InputError: no document parses, or one declares entities (never in nvidia-smi output).
    """
    if "<!ENTITY" in text:
        raise InputError(f"{name}: XML with entity declarations is not nvidia-smi output")
    gpus: list[GpuReading] = []
    processes: list[ProcessReading] = []
    documents = 0
    for chunk in _documents(text):
        try:
            root = ET.fromstring(chunk)
        except ET.ParseError:
            continue  # a damaged document: keep the others
        documents += 1
        t = parse_time(root.findtext("timestamp"))
        driver = text_or_none(root.findtext("driver_version"))
        for position, gpu in enumerate(root.findall("gpu")):
            gpus.extend(_gpu(gpu, position, t, driver))
            processes.extend(_processes(gpu, position, t))
    if not documents:
        raise InputError(f"{name}: no complete nvidia-smi XML document in it")
    return gpus, processes


def _documents(text: str) -> list[str]:
    # Each root element stands alone; a document cut short while written has no end tag.
    return [m.group(0) for m in _DOCUMENT.finditer(text)]


def _memory(element: ET.Element | None) -> Memory:
    if element is None:
        return NO_MEMORY
    return Memory(
        total_bytes=size_or_none(element.findtext("total")),
        used_bytes=size_or_none(element.findtext("used")),
        free_bytes=size_or_none(element.findtext("free")),
        reserved_bytes=size_or_none(element.findtext("reserved")),
    )


def _gpu(gpu: ET.Element, position: int, t: float | None, driver: str | None) -> list[GpuReading]:
    name = text_or_none(gpu.findtext("product_name"))
    readings = [
        GpuReading(
            t_unix=t,
            position=position,
            name=name,
            uuid=text_or_none(gpu.findtext("uuid")),
            bus_id=gpu.get("id") or text_or_none(gpu.findtext("pci/pci_bus_id")),
            driver_version=driver,
            memory=_memory(gpu.find("fb_memory_usage")),
        )
    ]
    for mig in gpu.findall("mig_devices/mig_device"):
        mig_index = int_or_none(mig.findtext("index"))
        if mig_index is None:
            continue
        readings.append(
            GpuReading(
                t_unix=t,
                position=position,
                name=f"{name or 'GPU'} MIG {mig_index}",
                driver_version=driver,
                parent=position,
                mig_index=mig_index,
                gpu_instance=int_or_none(mig.findtext("gpu_instance_id")),
                compute_instance=int_or_none(mig.findtext("compute_instance_id")),
                memory=_memory(mig.find("fb_memory_usage")),
            )
        )
    return readings


def _processes(gpu: ET.Element, position: int, t: float | None) -> list[ProcessReading]:
    out: list[ProcessReading] = []
    for proc in gpu.findall("processes/process_info"):
        pid = int_or_none(proc.findtext("pid"))
        if pid is None:
            continue
        out.append(
            ProcessReading(
                t_unix=t,
                pid=pid,
                command=text_or_none(proc.findtext("process_name")),
                used_bytes=size_or_none(proc.findtext("used_memory")),
                position=position,
                gpu_instance=int_or_none(proc.findtext("gpu_instance_id")),
                compute_instance=int_or_none(proc.findtext("compute_instance_id")),
            )
        )
    return out
