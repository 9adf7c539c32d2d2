"""Byte and time units: parse the sizes frameworks print, and format sizes for people."""

from __future__ import annotations

import math
import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_BINARY = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "pib": 1024**5,
    "eib": 1024**6,
    # Frameworks print "KB"/"MB"/"GB" but mean powers of 1024 (PyTorch <1.5, TF, XLA).
    "k": KiB,
    "kb": KiB,
    "m": MiB,
    "mb": MiB,
    "g": GiB,
    "gb": GiB,
    "t": TiB,
    "tb": TiB,
    "eb": 1024**6,
    "pb": 1024**5,
}

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int | None:
    """Parse "1.39 GiB", "576.00 KiB", "0 bytes", "8.00MiB" into bytes; None if not a size."""
    match = _SIZE_RE.match(text)
    if match is None:
        return None
    unit = match.group(2).lower() or "b"
    factor = _BINARY.get(unit)
    if factor is None:
        return None
    value = float(match.group(1))
    if not math.isfinite(value):
        return None
    return round(value * factor)


def format_bytes(num_bytes: float | None, precision: int = 1) -> str:
    """Format bytes in binary units, e.g. 13.9 GiB; '-' when unknown."""
    if num_bytes is None or (isinstance(num_bytes, float) and math.isnan(num_bytes)):
        return "-"
    sign = "-" if num_bytes < 0 else ""
    value = abs(float(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_duration(seconds: float | None) -> str:
    """Format seconds as 1h02m, 3m05s, 12.3s, or 850 ms; '-' when unknown."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_percent(fraction: float | None) -> str:
    """Format a fraction in [0, 1] as a percentage: whole percents, and one decimal below
    1% ("0.3%"), where a whole percent would read as nothing at all."""
    if fraction is None or math.isnan(fraction):
        return "-"
    if 0 < abs(fraction) < 0.0095:
        return f"{fraction * 100:.1f}%" if abs(fraction) >= 0.0005 else "<0.1%"
    return f"{fraction * 100:.0f}%"
