"""Read `nvidia-smi --query-gpu` / `--query-compute-apps` CSV logs, with or without units."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.errors import InputError
from memdoc.importers.smi_readings import (
    GpuReading,
    Memory,
    ProcessReading,
    int_or_none,
    parse_time,
    size_or_none,
    text_or_none,
)

# Fields memdoc reads; any others in a log are skipped.
GPU_FIELDS = frozenset(
    {"timestamp", "index", "name", "uuid", "pci.bus_id", "driver_version"}
    | {"memory.total", "memory.used", "memory.free", "memory.reserved"}
)
PROCESS_FIELDS = frozenset(
    {"timestamp", "pid", "process_name", "name", "used_gpu_memory", "used_memory"}
    | {"gpu_uuid", "gpu_bus_id", "gpu_name"}
)
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
UNTIMED_INTERVAL_S = 1.0


@dataclass(frozen=True)
class CsvLog:
    """What a CSV log held, and whether its rows had times."""

    gpus: list[GpuReading]
    processes: list[ProcessReading]
    timed: bool


def field_name(column: str) -> str:
    """'memory.used [MiB]' -> 'memory.used'; query field names are case-insensitive."""
    return _UNIT.sub("", column).strip().lower()


def is_header(line: str) -> bool:
    """A CSV header of a query memdoc reads: one with a memory field. (Accounted apps, with
    `max_memory_usage`, list processes that have ended: they are not read.)"""
    names = {field_name(c) for c in line.split(",")}
    wanted = {"memory.used", "memory.total", "memory.free", "used_gpu_memory", "used_memory"}
    return len(names) >= 2 and bool(names & wanted) and all(n and " " not in n for n in names)


def parse_columns(text: str) -> list[str]:
    """A `--columns` value ("timestamp,index,memory.used") as field names."""
    columns = [field_name(c) for c in text.split(",") if c.strip()]
    if not columns:
        raise InputError("--columns: no field names given")
    return columns


def parse_smi_csv(
    lines: Sequence[str], start_unix: float, columns: Sequence[str] | None = None
) -> CsvLog:
    """Rows of a query log. A header line sets the columns (a log may repeat it); without one,
    `columns` must say what they are. Rows without a timestamp are placed one second apart,
    from `start_unix`.

    Raises:
        InputError: rows without a header and no `columns`, or rows of the wrong width.
    """
    header = list(columns) if columns else None
    gpus: list[GpuReading] = []
    processes: list[ProcessReading] = []
    clock = _UntimedClock(start_unix)
    timed = True
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if is_header(line):
            header = [field_name(c) for c in line.split(",")]
            continue
        if header is None:
            raise InputError(
                "a CSV log without a header line: memdoc cannot tell which column is which",
                hint="pass the query's field list: --columns timestamp,index,memory.used,...",
            )
        cells = _fit([c.strip() for c in line.split(",")], header)
        if cells is None:
            if number == len(lines):
                break  # the last row of a log cut short while written
            raise InputError(f"line {number} does not have the {len(header)} columns of its header")
        row = dict(zip(header, cells, strict=True))
        timed = timed and "timestamp" in row
        if "pid" in row:
            _process_row(row, processes, clock)
        else:
            _gpu_row(row, gpus, clock)
    return CsvLog(gpus=gpus, processes=processes, timed=timed)


def _fit(cells: list[str], header: list[str]) -> list[str] | None:
    """Cells matched to the header; a process name may itself hold commas (command lines)."""
    if len(cells) == len(header):
        return cells
    extra = len(cells) - len(header)
    name_column = next((i for i, h in enumerate(header) if h in ("process_name", "name")), None)
    if extra < 0 or name_column is None:
        return None
    joined = ", ".join(cells[name_column : name_column + extra + 1])
    return [*cells[:name_column], joined, *cells[name_column + extra + 1 :]]


class _UntimedClock:
    """Times for rows without a timestamp: a new instant each time a device comes round again."""

    def __init__(self, start_unix: float) -> None:
        self._t = start_unix
        self._seen: set[object] = set()

    def at(self, key: object) -> float:
        if key in self._seen:
            self._t += UNTIMED_INTERVAL_S
            self._seen.clear()
        self._seen.add(key)
        return self._t


def _gpu_row(row: dict[str, str], out: list[GpuReading], clock: _UntimedClock) -> None:
    uuid = text_or_none(row.get("uuid"))
    bus_id = text_or_none(row.get("pci.bus_id"))
    position = int_or_none(row.get("index"))
    if position is None:
        position = _position(out, uuid, bus_id)
    t = parse_time(row.get("timestamp")) if "timestamp" in row else clock.at(position)
    out.append(
        GpuReading(
            t_unix=t,
            position=position,
            name=text_or_none(row.get("name")),
            uuid=uuid,
            bus_id=bus_id,
            memory=Memory(
                total_bytes=size_or_none(row.get("memory.total")),
                used_bytes=size_or_none(row.get("memory.used")),
                free_bytes=size_or_none(row.get("memory.free")),
                reserved_bytes=size_or_none(row.get("memory.reserved")),
            ),
            driver_version=text_or_none(row.get("driver_version")),
        )
    )


def _position(known: list[GpuReading], uuid: str | None, bus_id: str | None) -> int:
    """Without an index column: devices in order of first appearance, by uuid or bus id."""
    order: list[str] = []
    for gpu in known:
        key = gpu.uuid or gpu.bus_id
        if key and key not in order:
            order.append(key)
    key = uuid or bus_id
    if key is None:
        return 0
    return order.index(key) if key in order else len(order)


def _process_row(row: dict[str, str], out: list[ProcessReading], clock: _UntimedClock) -> None:
    pid = int_or_none(row.get("pid"))
    if pid is None:
        return
    used = row.get("used_gpu_memory", row.get("used_memory"))
    t = parse_time(row.get("timestamp")) if "timestamp" in row else clock.at(pid)
    out.append(
        ProcessReading(
            t_unix=t,
            pid=pid,
            command=text_or_none(row.get("process_name", row.get("name"))),
            used_bytes=size_or_none(used),
            uuid=text_or_none(row.get("gpu_uuid")),
            bus_id=text_or_none(row.get("gpu_bus_id")),
            gpu_name=text_or_none(row.get("gpu_name")),
        )
    )
