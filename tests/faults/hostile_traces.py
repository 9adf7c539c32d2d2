"""Traces that carry a hostile string in every string field, written with the real writer."""

from __future__ import annotations

from pathlib import Path

from memdoc.trace import (
    SCHEMA_VERSION,
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    ExitInfo,
    Header,
    Metric,
    OomInfo,
    ProcessInfo,
    SeriesKey,
    TraceWriter,
)
from memdoc.units import GiB, MiB

T0 = 1764687600.0
PID = 4243
OTHER_PID = 9001
TOTAL_BYTES = 16 * GiB

# What an attacker (or an unlucky program) puts in the text memdoc shows.
ATTACKS = {
    "csi-clear-screen": "\x1b[2J\x1b[H",
    "osc52-clipboard": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "osc8-link": "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "c1-csi": "\x9b31m",
    "bell": "\x07\x07",
    "backspace-overwrite": "safe\x08\x08\x08\x08evil",
    "carriage-return": "fine\rEVIL",
    "rich-markup": "[bold red]shout[/bold red]",
    "rich-link": "[link=https://evil.example]here[/link]",
    "html-script": "<script>alert('memdoc')</script>",
    "html-attribute": "\"'><img src=x onerror=alert(1)>",
    "lone-surrogate": "caf\udce9",
    "lone-high-surrogate": "x\ud800y",
    "bidi-override": "\u202eevil\u202c",
}
# The characters that must never reach a terminal raw.
CONTROL_CHARACTERS = frozenset(
    chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]
)


def raw_controls(text: str) -> set[str]:
    """Control characters, lone surrogates and bidi overrides present in `text`."""
    return {
        ch
        for ch in text
        if ch in CONTROL_CHARACTERS
        or 0xD800 <= ord(ch) <= 0xDFFF
        or 0x202A <= ord(ch) <= 0x202E
        or 0x2066 <= ord(ch) <= 0x2069
    }


def write_hostile_trace(path: Path, s: str) -> Path:
    """A PyTorch OOM run whose every string field holds `s`."""
    header = Header(
        version=SCHEMA_VERSION,
        created_unix=T0,
        memdoc_version="0.1.0",
        command=("train.py", s, "--name", s),
        host=f"node-{s}",
        pid=PID - 1,
        cwd=f"/home/{s}/project",
        python=f"3.12.3 {s}",
        interval_s=0.1,
        env={"PYTORCH_CUDA_ALLOC_CONF": f"expandable_segments:True{s}", "CUDA_VISIBLE_DEVICES": s},
    )
    w = TraceWriter(path, header)
    w.devices([DeviceInfo(0, f"NVIDIA {s}", TOTAL_BYTES, f"GPU-{s}", driver_version=s)])
    w.process(ProcessInfo(PID, T0 + 0.01, PID - 1, ("python", s), True, user=s))
    w.process(ProcessInfo(OTHER_PID, T0 + 0.01, 1, (f"/opt/{s}", s), False, user=s))
    w.collector(CollectorStatus(f"nvml{s}", False, T0, PID, reason=s, hint=s, version=s))
    w.event(Event(T0 + 0.02, EventKind.FRAMEWORK, PID, {"name": "pytorch", "version": s}))
    w.event(Event(T0 + 0.5, EventKind.MARK, PID, {"label": s}))
    for step in range(1, 6):
        t = T0 + step * 0.5
        allocated = (6 + step) * GiB
        w.samples(
            t,
            {
                SeriesKey("torch.allocated", 0, PID): allocated,
                SeriesKey("torch.reserved", 0, PID): allocated + 512 * MiB,
                SeriesKey(Metric.GPU_USED, 0): allocated + GiB,
                SeriesKey(Metric.GPU_FREE, 0): TOTAL_BYTES - allocated - GiB,
                SeriesKey(Metric.GPU_PROC_USED, 0, OTHER_PID): GiB,
                SeriesKey(Metric.HOST_RSS): 3 * GiB,
            },
        )
        w.event(Event(t + 0.01, EventKind.STEP, PID, {"step": step, "source": s}))
    message = (
        f"torch.OutOfMemoryError: CUDA out of memory. {s} Tried to allocate 226.00 MiB. GPU 0 "
        f"has a total capacity of 15.58 GiB of which 71.25 MiB is free. {s}"
    )
    oom = OomInfo(
        framework="pytorch",
        message=message,
        device=0,
        device_type="gpu",
        requested_bytes=226 * MiB,
        total_bytes=TOTAL_BYTES,
        free_bytes=71 * MiB,
        op=s,
        dtype=s,
        allocator=s,
        hint=s,
    )
    stack = [f"{s}.py:88:<module>", f"train.py:61:{s}"]
    t_oom = T0 + 3.0
    w.event(Event(t_oom, EventKind.OOM, PID, {"oom": oom.to_dict(), "stack": stack}))
    w.event(
        Event(
            t_oom + 0.01,
            EventKind.EXCEPTION,
            PID,
            {"type": f"torch.OutOfMemoryError{s}", "message": message, "where": s},
        )
    )
    w.event(Event(t_oom + 0.02, EventKind.NOTE, PID, {"text": s}))
    snapshot = {"path": f"snapshots/{s}.pickle", "reason": s}
    w.event(Event(t_oom + 0.05, EventKind.SNAPSHOT, PID, snapshot))
    w.close(ExitInfo(t_oom + 0.3, exit_code=1, reason=s))
    return path
