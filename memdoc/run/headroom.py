"""Find the largest batch size that fits: run a few steps at a few sizes, fit, extrapolate."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memdoc.errors import InputError, MemdocError
from memdoc.forecast.headroom import (
    HeadroomFit,
    PeakReading,
    SizePeak,
    fit_headroom,
    nearest_pair,
    run_peak,
)
from memdoc.run.agent import ENV_STOP_AFTER_STEPS
from memdoc.trace.reader import load_trace

PLACEHOLDER = "{}"
DEFAULT_SIZES = (8, 16, 32)
DEFAULT_STEPS = 5
DEFAULT_MARGIN = 0.05
PROBE_TIMEOUT_S = 1800.0
# Probes at the predicted answer, each refitting near it.
DEFAULT_REFINE = 4


@dataclass(frozen=True)
class Probe:
    """One size, run for a few steps under `memdoc run`."""

    size: int
    status: int
    steps: int
    oom: bool
    reading: PeakReading | None
    trace_path: Path
    last_error_line: str = ""


@dataclass(frozen=True)
class Headroom:
    """The probes, the line fitted through them, and the limit that applies."""

    probes: tuple[Probe, ...]
    fit: HeadroomFit
    limit_label: str
    notes: tuple[str, ...] = field(default=())
    measured: bool = False  # the answer was itself run, not only extrapolated

    @property
    def largest_size(self) -> int | None:
        return self.fit.largest_size


def command_for(template: Sequence[str], size: int) -> list[str]:
    """The command with every `{}` replaced by the size."""
    return [arg.replace(PLACEHOLDER, str(size)) for arg in template]


def check_template(template: Sequence[str], sizes: Sequence[int]) -> None:
    """Raises:
    InputError: no command, no `{}` in it, a command that does not exist, or fewer than
    two distinct positive sizes."""
    if not template:
        raise InputError("no command to run", hint="memdoc headroom -- python train.py --batch {}")
    if not any(PLACEHOLDER in arg for arg in template):
        raise InputError(
            "the command has no {} where the batch size goes",
            hint="memdoc headroom -- python train.py --batch-size {}",
        )
    if shutil.which(template[0]) is None and not Path(template[0]).exists():
        raise InputError(f"{template[0]}: command not found")
    if len({s for s in sizes if s > 0}) < 2 or any(s <= 0 for s in sizes):
        raise InputError("give at least two different positive sizes, e.g. --sizes 8,16,32")


def probe(
    template: Sequence[str], size: int, *, steps: int, workdir: Path, interval_s: float = 0.1
) -> Probe:
    """Run the program at one size until it has done `steps` steps (or ends)."""
    trace_path = workdir / f"size-{size}.memdoc"
    log_path = workdir / f"size-{size}.log"
    env = dict(os.environ)
    env[ENV_STOP_AFTER_STEPS] = str(steps)
    env.pop("MEMDOC_AGENT", None)  # a headroom search inside a watched run starts afresh
    memdoc_run = [sys.executable, "-m", "memdoc", "run", "-q", "--force", "--interval"]
    memdoc_run += [repr(interval_s), "-o", str(trace_path), "--", *command_for(template, size)]
    with open(log_path, "wb") as log:
        try:
            done = subprocess.run(
                memdoc_run,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise MemdocError(f"size {size}: still running after {PROBE_TIMEOUT_S:.0f} s") from None
    try:
        trace = load_trace(trace_path)
    except MemdocError as exc:
        raise MemdocError(f"size {size}: no trace was recorded ({exc.message})") from None
    return Probe(
        size=size,
        status=done.returncode,
        steps=len(trace.steps()),
        oom=trace.ending_oom() is not None,
        reading=run_peak(trace),
        trace_path=trace_path,
        last_error_line=_last_line(log_path),
    )


def find_headroom(
    template: Sequence[str],
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    steps: int = DEFAULT_STEPS,
    margin: float = DEFAULT_MARGIN,
    multiple_of: int = 1,
    workdir: str | os.PathLike[str] | None = None,
    refine: int = DEFAULT_REFINE,
) -> Headroom:
    """Probe each size, fit memory against size, and say the largest size that fits.

    Raises:
        InputError: a bad command or size list.
        MemdocError: a size failed for a reason other than memory, or too few sizes ran.
    """
    check_template(template, sizes)
    if not 0 <= margin < 1:
        raise InputError("the margin is a share of the limit: between 0 and 1, e.g. 0.05")
    if multiple_of < 1 or steps < 1:
        raise InputError("--steps and --multiple-of must be at least 1")
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="memdoc-hr-"))
    probes = [probe(template, size, steps=steps, workdir=folder) for size in sorted(set(sizes))]
    for p in probes:
        if p.status != 0 and not p.oom:
            raise MemdocError(
                f"size {p.size}: the program failed (exit status {p.status}) without running "
                f"out of memory: {p.last_error_line or 'no output'}",
                hint=f"its output and trace are in {folder}",
            )
    good = [p for p in probes if not p.oom and p.reading is not None]
    notes = [f"size {p.size} ran out of memory while probing" for p in probes if p.oom]
    if len(good) < 2:
        raise MemdocError(
            f"only {len(good)} size(s) ran without running out of memory; two are needed",
            hint="probe smaller sizes, e.g. --sizes 2,4,8",
        )
    readings = [p.reading for p in good if p.reading is not None]
    tightest = min(readings, key=lambda r: r.limit_bytes)
    limit = tightest.limit_bytes
    points = [SizePeak(p.size, p.reading.peak_bytes) for p in good if p.reading is not None]
    too_big = min((p.size for p in probes if p.oom), default=None)
    fit = fit_headroom(points, limit, margin=margin, multiple_of=multiple_of, below=too_big)
    if fit is None:
        raise MemdocError("two different sizes are needed for a fit")
    # Extrapolating far from the probed sizes misses what large requests cost (allocator
    # thresholds, fragmentation): run the answer itself, and refit near it.
    for _ in range(refine):
        candidate = fit.largest_size
        if candidate is None or candidate in {p.size for p in probes}:
            break
        checked = probe(template, candidate, steps=steps, workdir=folder)
        probes.append(checked)
        if checked.oom or checked.reading is None:
            too_big = min(candidate, too_big or candidate)
        else:
            points.append(SizePeak(candidate, checked.reading.peak_bytes))
        fit = (
            fit_headroom(
                nearest_pair(points), limit, margin=margin, multiple_of=multiple_of, below=too_big
            )
            or fit
        )
    ran = {p.size for p in probes if not p.oom and p.reading is not None}
    if too_big is not None and fit.largest_size not in ran:
        # Between a size that ran and one that ran out, a line is only a guess: answer with
        # the largest size that really ran.
        below = [s for s in ran if s < too_big and s % multiple_of == 0]
        if below:
            fit = dataclasses.replace(fit, largest_size=max(below))
    measured = fit.largest_size in ran
    return Headroom(tuple(probes), fit, tightest.limit_label, tuple(notes), measured)


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.strip() and not line.startswith("memdoc:"):
            return line.strip()[:300]
    return ""
