"""Read `nvidia-smi dmon` and `pmon` output: whitespace tables under a '# gpu ...' header."""

from __future__ import annotations

import calendar
import time
from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.importers.smi_readings import GpuReading, Memory, ProcessReading, size_or_none

UNTIMED_INTERVAL_S = 1.0  # dmon and pmon sample every second unless told otherwise


@dataclass(frozen=True)
class MonitorLog:
    """What a dmon or pmon table held. `has_memory` is false without the `fb` column
    (recorded without `-s m`): the default `mem` column is bandwidth use, not bytes."""

    gpus: list[GpuReading]
    processes: list[ProcessReading]
    has_memory: bool
    timed: bool


def is_monitor_header(line: str) -> bool:
    names = line.lstrip("#").split()
    return line.startswith("#") and "gpu" in names and ("pid" in names or len(names) > 2)


def parse_monitor(lines: Sequence[str], start_unix: float) -> MonitorLog:
    """Rows under the last '# gpu ...' header line; '# Idx ...' unit lines are skipped."""
    header: list[str] | None = None
    gpus: list[GpuReading] = []
    processes: list[ProcessReading] = []
    clock = start_unix
    seen: set[tuple[str, str]] = set()
    timed = False
    for line in lines:
        if line.startswith("#"):
            if is_monitor_header(line):
                header = line.lstrip("#").split()
            continue
        cells = line.split()
        if header is None or len(cells) < len(header) - 1:
            continue
        row = _row(header, cells)
        t = _row_time(row, start_unix)
        if t is None:
            key = (row.get("gpu", ""), row.get("pid", ""))
            if key in seen:
                clock += UNTIMED_INTERVAL_S
                seen.clear()
            seen.add(key)
            t = clock
        else:
            timed = True
        _add(row, t, gpus, processes)
    return MonitorLog(gpus, processes, has_memory=bool(header and "fb" in header), timed=timed)


def _row(header: list[str], cells: list[str]) -> dict[str, str]:
    # The command is the last column and the only one that can be missing or hold spaces.
    row = dict(zip(header, cells, strict=False))
    if header[-1] == "command":
        row["command"] = " ".join(cells[len(header) - 1 :])
    return row


def _row_time(row: dict[str, str], start_unix: float) -> float | None:
    """From the Date and Time columns (`-o DT`); a Time alone is taken on the start's day."""
    clock = row.get("Time")
    if not clock:
        return None
    date = row.get("Date") or time.strftime("%Y%m%d", time.gmtime(start_unix))
    text = f"{date} {clock}"
    try:
        return float(calendar.timegm(time.strptime(text, "%Y%m%d %H:%M:%S")))
    except ValueError:
        return None


def _add(
    row: dict[str, str], t: float, gpus: list[GpuReading], processes: list[ProcessReading]
) -> None:
    position = _int(row.get("gpu"))
    if position is None:
        return
    used = size_or_none(row.get("fb"), default_unit="MiB") if row.get("fb") != "-" else None
    pid = _int(row.get("pid")) if "pid" in row else None
    if pid is not None:
        command = row.get("command", "").strip()
        processes.append(
            ProcessReading(
                t_unix=t, pid=pid, command=command or None, used_bytes=used, position=position
            )
        )
    elif "pid" not in row:
        gpus.append(GpuReading(t_unix=t, position=position, memory=Memory(used_bytes=used)))


def _int(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    return int(text)
