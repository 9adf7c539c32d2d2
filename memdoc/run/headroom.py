"""Find the largest batch size that fits: run a few steps at a few sizes, fit, extrapolate."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memdoc.errors import InputError, MemdocError
from memdoc.files import open_output, output_folder
from memdoc.forecast.headroom import (
    HeadroomFit,
    PeakReading,
    SizePeak,
    fit_headroom,
    nearest_pair,
    run_peak,
)
from memdoc.run.agent import ENV_STOP_AFTER_STEPS
from memdoc.run.group import PROBE_TIMEOUT_S, run_in_own_group
from memdoc.trace.reader import load_trace

PLACEHOLDER = "{}"
DEFAULT_SIZES = (8, 16, 32)
DEFAULT_STEPS = 5
DEFAULT_MARGIN = 0.05
# Probes at the predicted answer, each refitting near it.
DEFAULT_REFINE = 4
# A probe is at most this many times the largest size that trained: evidence first.
MAX_GROWTH = 4


@dataclass(frozen=True)
class Probe:
    """One size, run for a few steps under `memdoc run`."""

    size: int
    status: int
    steps: int
    oom: bool
    reading: PeakReading | None
    trace_path: Path | None  # None: the probes' folder was temporary, and is gone
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
    template: Sequence[str],
    size: int,
    *,
    steps: int,
    workdir: Path,
    interval_s: float = 0.1,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Probe:
    """Run the program at one size until it has done `steps` steps (or ends), in a process
    group of its own that is ended whole on a timeout or an interrupt.

    Raises:
        MemdocError: the probe ran past `timeout_s`, recorded no trace, or its log is a link
            that another user planted.
    """
    trace_path = workdir / f"size-{size}.memdoc"
    log_path = workdir / f"size-{size}.log"
    memdoc_run = [sys.executable, "-m", "memdoc", "run", "-q", "--force", "--interval"]
    memdoc_run += [repr(interval_s), "-o", str(trace_path), "--", *command_for(template, size)]
    with open_output(log_path, force=True) as log:
        try:
            status = run_in_own_group(
                memdoc_run, env=_probe_environment(steps), stdout=log, timeout_s=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise MemdocError(
                f"size {size}: still running after {timeout_s:g} s; its run was ended",
                hint="give a slower program more time with --timeout",
            ) from None
    try:
        trace = load_trace(trace_path)
    except MemdocError as exc:
        raise MemdocError(f"size {size}: no trace was recorded ({exc.message})") from None
    return Probe(
        size=size,
        status=status,
        steps=len(trace.steps()),
        oom=trace.ending_oom() is not None,
        reading=run_peak(trace),
        trace_path=trace_path,
        last_error_line=_last_line(log_path),
    )


def _probe_environment(steps: int) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_STOP_AFTER_STEPS] = str(steps)
    env.pop("MEMDOC_AGENT", None)  # a headroom search inside a watched run starts afresh
    return env


@dataclass
class _Search:
    """What every probe of one search shares."""

    template: Sequence[str]
    steps: int
    folder: Path
    kept: bool  # the folder is the user's, kept after the search
    timeout_s: float
    probes: list[Probe] = field(default_factory=list)

    def run(self, size: int) -> Probe:
        """Probe one size; a run that failed otherwise than by memory, or that reported no
        step, ends the search (nothing can be fitted from it).

        Raises:
            MemdocError: see `probe`; the program failed, or reported no step.
        """
        done = probe(
            self.template, size, steps=self.steps, workdir=self.folder, timeout_s=self.timeout_s
        )
        self.probes.append(done)
        self._check(done)
        return done

    def _check(self, p: Probe) -> None:
        where = (
            f"its output and trace are in {self.folder}"
            if self.kept
            else "keep each probe's output and trace with --keep DIR"
        )
        if p.status != 0 and not p.oom:
            raise MemdocError(
                f"size {p.size}: the program failed (exit status {p.status}) without running "
                f"out of memory: {p.last_error_line or 'no output'}",
                hint=where,
            )
        if not p.oom and p.steps == 0:
            raise MemdocError(
                f"size {p.size}: the program reported no training step, so there is no "
                "per-step peak to fit; nothing was answered",
                hint="memdoc counts PyTorch optimizer steps, the Keras, Lightning and Hugging "
                "Face callbacks' steps, and memdoc.step() in your own loop",
            )

    def trained(self) -> list[int]:
        return [p.size for p in self.probes if not p.oom and p.reading is not None]


def find_headroom(
    template: Sequence[str],
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    steps: int = DEFAULT_STEPS,
    margin: float = DEFAULT_MARGIN,
    multiple_of: int = 1,
    workdir: str | os.PathLike[str] | None = None,
    refine: int = DEFAULT_REFINE,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Headroom:
    """Probe each size, fit memory against size, and say the largest size that fits.

    Each probe's trace and output go to `workdir` (created if missing), else to a temporary
    folder removed at the end, also on an error or an interrupt.

    Raises:
        InputError: a bad command, size list or setting.
        MemdocError: a size failed for a reason other than memory, reported no step, ran past
            `timeout_s`, or too few sizes ran.
    """
    check_template(template, sizes)
    _check_settings(margin=margin, multiple_of=multiple_of, steps=steps, timeout_s=timeout_s)
    with _probe_folder(workdir) as folder:
        search = _Search(template, steps, folder, workdir is not None, timeout_s)
        result = _search(search, sorted(set(sizes)), margin, multiple_of, refine)
    if workdir is None:  # the traces went with the folder
        probes = tuple(dataclasses.replace(p, trace_path=None) for p in result.probes)
        result = dataclasses.replace(result, probes=probes)
    return result


def _check_settings(*, margin: float, multiple_of: int, steps: int, timeout_s: float) -> None:
    """Raises:
    InputError: a margin outside [0, 1), a step count or multiple below 1, a bad timeout."""
    if not 0 <= margin < 1:
        raise InputError("the margin is a share of the limit: between 0 and 1, e.g. 0.05")
    if multiple_of < 1 or steps < 1:
        raise InputError("--steps and --multiple-of must be at least 1")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise InputError("--timeout is a positive number of seconds")


@contextlib.contextmanager
def _probe_folder(workdir: str | os.PathLike[str] | None) -> Iterator[Path]:
    """The user's folder (made safely when missing), or a temporary one removed at the end."""
    if workdir is not None:
        yield output_folder(Path(workdir))
        return
    folder = Path(tempfile.mkdtemp(prefix="memdoc-hr-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _search(
    search: _Search, sizes: Sequence[int], margin: float, multiple_of: int, refine: int
) -> Headroom:
    for size in sizes:
        search.run(size)
    probes = search.probes
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
    # thresholds, fragmentation): run the answer itself, and refit near it; never more than
    # a few times the largest size that trained at once.
    for _ in range(refine):
        if fit.largest_size is None:
            break
        candidate = next_probe(fit.largest_size, search.trained(), multiple_of)
        if candidate in {p.size for p in probes}:
            break
        checked = search.run(candidate)
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
    ran = set(search.trained())
    if too_big is not None and fit.largest_size not in ran:
        # Between a size that ran and one that ran out, a line is only a guess: answer with
        # the largest size that really ran.
        below = [s for s in ran if s < too_big and s % multiple_of == 0]
        if below:
            fit = dataclasses.replace(fit, largest_size=max(below))
    measured = fit.largest_size in ran
    return Headroom(tuple(probes), fit, tightest.limit_label, tuple(notes), measured)


def next_probe(predicted: int, trained: Sequence[int], multiple_of: int) -> int:
    """The size to run next: the predicted answer, but no more than MAX_GROWTH times the
    largest size that trained (rounded down to `multiple_of`, and at least the next
    multiple above it): a line through small sizes says little about huge ones, and a huge
    probe can take the whole machine."""
    largest = max(trained)
    cap = MAX_GROWTH * largest
    cap -= cap % multiple_of
    cap = max(cap, largest + multiple_of - largest % multiple_of)
    return min(predicted, cap)


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.strip() and not line.startswith("memdoc:"):
            return line.strip()[:300]
    return ""
