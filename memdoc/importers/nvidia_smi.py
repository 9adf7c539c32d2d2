"""Import nvidia-smi output of any kind: XML, `-q` text, query CSV logs, dmon/pmon, captures."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from memdoc.errors import InputError
from memdoc.importers.build import TraceBuilder
from memdoc.importers.smi_csv import is_header, parse_smi_csv
from memdoc.importers.smi_monitor import is_monitor_header, parse_monitor
from memdoc.importers.smi_readings import GpuReading, ProcessReading, add_readings
from memdoc.importers.smi_text import LOG_BANNER, parse_smi_text
from memdoc.importers.smi_xml import looks_like_smi_xml, parse_smi_xml

MAX_TEXT_BYTES = 1024**3
# Capture files (one file, many commands) separate their sections with lines of '#'.
_BANNER = re.compile(r"^#{20,}\s*$")
NO_TIME_ZONE_NOTE = (
    "nvidia-smi timestamps carry no time zone; memdoc read them as UTC, so they can be off by "
    "the recording machine's offset when compared with other files."
)


def looks_like_smi(head: str, columns: Sequence[str] | None = None) -> bool:
    """True when the text holds any nvidia-smi output memdoc reads."""
    if looks_like_smi_xml(head) or LOG_BANNER in head:
        return True
    lines = head.splitlines()
    return any(is_header(line) or is_monitor_header(line) for line in lines) or bool(
        columns and lines
    )


def import_nvidia_smi(
    path: Path, text: str, builder: TraceBuilder, columns: Sequence[str] | None = None
) -> None:
    """Add every device reading and process listing of the file to `builder`.

    Raises:
        InputError: nothing in the file is nvidia-smi output memdoc reads.
    """
    fallback = path.stat().st_mtime
    if looks_like_smi_xml(text[:65536]):
        gpus, processes = parse_smi_xml(text, str(path))
        add_readings(builder, gpus, processes, fallback)
        _note_times(builder, gpus, processes, fallback)
        return
    found = False
    last_t: float | None = None
    for lines in _sections(text):
        gpus, processes, note = _parse_section(lines, last_t or fallback, columns)
        if not gpus and not processes:
            continue
        found = True
        add_readings(builder, gpus, processes, last_t or fallback)
        timed = [t for t in _times(gpus, processes) if t is not None]
        last_t = max(timed) if timed else last_t
        if note:
            builder.note(last_t or fallback, note)
    if not found:
        raise InputError(f"{path}: no nvidia-smi memory readings in it")
    builder.note(last_t or fallback, NO_TIME_ZONE_NOTE)


def _sections(text: str) -> Iterator[list[str]]:
    """Runs of lines between banner lines (the whole text when there are none)."""
    section: list[str] = []
    for line in text.splitlines():
        if _BANNER.match(line):
            if section:
                yield section
            section = []
        else:
            section.append(line)
    if section:
        yield section


def _parse_section(
    lines: list[str], start_unix: float, columns: Sequence[str] | None
) -> tuple[list[GpuReading], list[ProcessReading], str | None]:
    if any(line.strip() == LOG_BANNER for line in lines):
        gpus, processes = parse_smi_text("\n".join(lines))
        return gpus, processes, None
    if any(is_monitor_header(line) for line in lines):
        log = parse_monitor(lines, start_unix)
        note = None
        if not log.has_memory:
            note = (
                "dmon/pmon output without the 'fb' column: it names devices and processes but "
                "not their memory (its 'mem' column is memory bandwidth use; record with -s m)."
            )
        if not log.timed and (log.gpus or log.processes):
            note = (note + " " if note else "") + "Its rows have no times: placed 1 s apart."
        return log.gpus, log.processes, note
    content = [line for line in lines if line.strip() and not line.startswith("#")]
    if content and (columns or any(is_header(line) for line in content)):
        csv = parse_smi_csv(content, start_unix, columns)
        note = None if csv.timed else "CSV rows without a timestamp: placed 1 s apart."
        return csv.gpus, csv.processes, note
    return [], [], None


def _note_times(
    builder: TraceBuilder,
    gpus: Sequence[GpuReading],
    processes: Sequence[ProcessReading],
    fallback: float,
) -> None:
    # Notes go at the last reading, not at the file's time: they must not stretch the run.
    times = [t for t in _times(gpus, processes) if t is not None]
    last = max(times) if times else fallback
    if len(times) < len(gpus) + len(processes):
        builder.note(last, "Some nvidia-smi logs have no timestamp: the file's time is used.")
    builder.note(last, NO_TIME_ZONE_NOTE)


def _times(gpus: Sequence[GpuReading], processes: Sequence[ProcessReading]) -> list[float | None]:
    return [g.t_unix for g in gpus] + [p.t_unix for p in processes]
