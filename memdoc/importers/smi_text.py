"""Read `nvidia-smi -q` text: an indented tree of "Key : value" lines, one log per interval."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

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

LOG_BANNER = "==============NVSMI LOG=============="
# "    Key      : value", or a heading ("    FB Memory Usage", "GPU 00000000:01:00.0").
_LINE = re.compile(r"^(?P<indent> *)(?P<key>.*?)(?:\s+:\s*(?P<value>.*?))?\s*$")


@dataclass
class _Node:
    key: str
    value: str | None
    children: list[_Node] = field(default_factory=list)

    def child(self, key: str) -> _Node | None:
        return next((c for c in self.children if c.key == key), None)

    def text(self, key: str) -> str | None:
        node = self.child(key)
        return node.value if node is not None else None


def looks_like_smi_text(head: str) -> bool:
    return LOG_BANNER in head


def parse_smi_text(text: str) -> tuple[list[GpuReading], list[ProcessReading]]:
    """Every log in the text (`nvidia-smi -q -l N` prints one per interval)."""
    gpus: list[GpuReading] = []
    processes: list[ProcessReading] = []
    for log in _logs(text):
        root = _tree(log)
        t = parse_time(root.text("Timestamp"))
        driver = text_or_none(root.text("Driver Version"))
        physical = [c for c in root.children if c.key.startswith("GPU ") and c.value is None]
        for position, gpu in enumerate(physical):
            gpus.extend(_gpu(gpu, position, t, driver))
            processes.extend(_processes(gpu, position, t))
    return gpus, processes


def _logs(text: str) -> Iterator[list[str]]:
    """The lines of each log, up to the next banner or the next non-indented foreign line."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == LOG_BANNER]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        body = []
        for line in lines[start + 1 : end]:
            if line.startswith("#"):
                break  # a section banner of a capture file
            body.append(line)
        yield body


def _tree(lines: list[str]) -> _Node:
    root = _Node("", None)
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for line in lines:
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        node = _Node(match["key"].strip(), match["value"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def _memory(node: _Node | None) -> Memory:
    if node is None:
        return NO_MEMORY
    return Memory(
        total_bytes=size_or_none(node.text("Total")),
        used_bytes=size_or_none(node.text("Used")),
        free_bytes=size_or_none(node.text("Free")),
        reserved_bytes=size_or_none(node.text("Reserved")),
    )


def _gpu(gpu: _Node, position: int, t: float | None, driver: str | None) -> list[GpuReading]:
    name = text_or_none(gpu.text("Product Name"))
    readings = [
        GpuReading(
            t_unix=t,
            position=position,
            name=name,
            uuid=text_or_none(gpu.text("GPU UUID")),
            bus_id=gpu.key.split(" ", 1)[1],
            driver_version=driver,
            memory=_memory(gpu.child("FB Memory Usage")),
        )
    ]
    for mig in (c for c in gpu.children if c.key == "MIG Device"):
        mig_index = int_or_none(mig.text("Index"))
        if mig_index is None:
            continue
        memory = mig.child("FB Memory Usage") or mig.child("Shared FB Memory Usage")
        readings.append(
            GpuReading(
                t_unix=t,
                position=position,
                name=f"{name or 'GPU'} MIG {mig_index}",
                driver_version=driver,
                parent=position,
                mig_index=mig_index,
                gpu_instance=int_or_none(mig.text("GPU Instance ID")),
                compute_instance=int_or_none(mig.text("Compute Instance ID")),
                memory=_memory(memory),
            )
        )
    return readings


def _processes(gpu: _Node, position: int, t: float | None) -> list[ProcessReading]:
    """Process entries: "GPU instance ID" and "Compute instance ID" lines come before the
    "Process ID" line they belong to, and its details are indented under it."""
    section = gpu.child("Processes")
    if section is None:
        return []
    out: list[ProcessReading] = []
    gpu_instance = compute_instance = None
    for node in section.children:
        if node.key == "GPU instance ID":
            gpu_instance = int_or_none(node.value)
        elif node.key == "Compute instance ID":
            compute_instance = int_or_none(node.value)
        elif node.key == "Process ID" and (pid := int_or_none(node.value)) is not None:
            out.append(
                ProcessReading(
                    t_unix=t,
                    pid=pid,
                    command=text_or_none(node.text("Name")),
                    used_bytes=size_or_none(node.text("Used GPU Memory")),
                    position=position,
                    gpu_instance=gpu_instance,
                    compute_instance=compute_instance,
                )
            )
            gpu_instance = compute_instance = None
    return out
