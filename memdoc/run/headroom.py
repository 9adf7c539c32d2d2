"""Find the largest batch size that fits: probe sizes until one trains and the next multiple
runs out, a robust fit choosing where to probe."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memdoc.errors import InputError, MemdocError
from memdoc.files import open_output, output_folder
from memdoc.forecast.bracket import Bracket, Outcome, next_size
from memdoc.forecast.headroom import HeadroomFit, PeakReading, SizePeak, fit_headroom, run_peak
from memdoc.run.agent import (
    ENV_MAX_STEPS,
    ENV_SETTLE_S,
    ENV_SETTLE_STEPS,
    ENV_STOP_AFTER_STEPS,
)
from memdoc.run.group import PROBE_TIMEOUT_S, run_in_own_group
from memdoc.trace.model import EventKind
from memdoc.trace.reader import load_trace

PLACEHOLDER = "{}"
# Signals a process dies of when an allocation fails in native code under an address-space
# cap: abort() on an uncaught std::bad_alloc, a fault on the null pointer malloc returned.
_ALLOCATION_CRASHES = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS})
DEFAULT_SIZES = (8, 16, 32)
# A probe runs at least this many steps, then on until its peak stops rising (see agent.py):
# the optimizer's first step and a first evaluation often raise it after the first steps.
DEFAULT_STEPS = 8
# ... until SETTLE_STEPS steps in a row have not raised it, and never past MAX_STEPS_FACTOR
# times the steps asked for (at least MIN_MAX_STEPS) nor past SETTLE_S seconds of stepping.
SETTLE_STEPS = 3
MAX_STEPS_FACTOR = 4
MIN_MAX_STEPS = 24
SETTLE_S = 300.0
DEFAULT_MARGIN = 0.05
# Probes after the first sizes: growing to a size that runs out, then bisecting.
DEFAULT_REFINE = 8


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
    settled: bool | None = None  # the peak had stopped rising when it ended; None: no stop
    # Killed by SIGSEGV, SIGABRT or SIGBUS above a size that trained: taken for running out.
    crashed: bool = False

    def fits(self, margin: float) -> bool:
        """It trained, with its peak under the limit less the share kept free."""
        if self.oom or self.crashed:
            return False
        reading = self.reading
        return reading is None or reading.peak_bytes <= reading.limit_bytes * (1.0 - margin)


@dataclass(frozen=True)
class Headroom:
    """The probes, the answer they bracket, and the line fitted through them.

    `largest_size` is a size that ran: the largest multiple asked for that trained under the
    limit less the margin. `too_big` is the smallest size that did not (ran out, or went over
    the margin); None when every probe fitted, and the answer is then "at least" that size.
    """

    probes: tuple[Probe, ...]
    fit: HeadroomFit | None  # None with fewer than two sizes that fitted
    limit_label: str
    limit_bytes: float | None
    margin: float
    multiple_of: int
    largest_size: int | None
    too_big: int | None
    notes: tuple[str, ...] = field(default=())

    @property
    def at_least(self) -> bool:
        """Every probe fitted: the answer is a lower bound, no size above it was seen to fail."""
        return self.largest_size is not None and self.too_big is None

    @property
    def measured(self) -> bool:
        """The answer itself ran (always so for an answer: it is never extrapolated)."""
        return self.largest_size is not None

    @property
    def usable_bytes(self) -> float | None:
        return None if self.limit_bytes is None else self.limit_bytes * (1.0 - self.margin)


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
    stops = trace.events(EventKind.STOP)
    return Probe(
        size=size,
        status=status,
        steps=len(trace.steps()),
        oom=trace.ending_oom() is not None,
        reading=run_peak(trace),
        trace_path=trace_path,
        last_error_line=_last_line(log_path),
        settled=bool(stops[-1].data.get("settled")) if stops else None,
    )


def crash_signal(status: int) -> int | None:
    """The signal that ended a run, from its exit status (-N, or 128 + N from a shell or a
    runner that mirrors it); None for an ordinary exit."""
    if status < 0:
        return -status
    if 128 < status < 160:
        return status - 128
    return None


def _probe_environment(steps: int) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_STOP_AFTER_STEPS] = str(steps)
    env[ENV_SETTLE_STEPS] = str(SETTLE_STEPS)
    env[ENV_MAX_STEPS] = str(max(MAX_STEPS_FACTOR * steps, MIN_MAX_STEPS))
    env[ENV_SETTLE_S] = repr(SETTLE_S)
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
        if self._crashed_above_a_size_that_trained(done):
            done = dataclasses.replace(done, crashed=True)
        self.probes.append(done)
        self._check(done)
        return done

    def _crashed_above_a_size_that_trained(self, p: Probe) -> bool:
        """Killed by a signal that a failed allocation raises (a native library's abort on
        std::bad_alloc, a segmentation fault on a null pointer from malloc), at a size above
        one that trained: the same program, larger, is taken to have run out of memory."""
        if p.oom or crash_signal(p.status) not in _ALLOCATION_CRASHES:
            return False
        return any(q.size < p.size and not q.oom and not q.crashed for q in self.probes)

    def _check(self, p: Probe) -> None:
        where = (
            f"its output and trace are in {self.folder}"
            if self.kept
            else "keep each probe's output and trace with --keep DIR"
        )
        if p.status != 0 and not p.oom and not p.crashed:
            raise MemdocError(
                f"size {p.size}: the program failed (exit status {p.status}) without running "
                f"out of memory: {p.last_error_line or 'no output'}",
                hint=where,
            )
        if not p.oom and not p.crashed and p.steps == 0:
            raise MemdocError(
                f"size {p.size}: the program reported no training step, so there is no "
                "per-step peak to fit; nothing was answered",
                hint="memdoc counts PyTorch optimizer steps, the Keras, Lightning and Hugging "
                "Face callbacks' steps, and memdoc.step() in your own loop",
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
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Headroom:
    """Probe sizes until the largest that trains and the smallest that runs out are adjacent
    multiples of `multiple_of` (or the probes are spent), and say the largest that trained.

    Each probe's trace and output go to `workdir` (created if missing), else to a temporary
    folder removed at the end, also on an error or an interrupt.

    Raises:
        InputError: a bad command, size list or setting.
        MemdocError: a size failed for a reason other than memory, reported no step, or ran
            past `timeout_s`.
    """
    check_template(template, sizes)
    _check_settings(margin=margin, multiple_of=multiple_of, steps=steps, timeout_s=timeout_s)
    with _probe_folder(workdir) as folder:
        search = _Search(template, steps, folder, workdir is not None, timeout_s)
        result = search_sizes(search.run, sorted(set(sizes)), margin, multiple_of, refine)
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


def search_sizes(
    run: Callable[[int], Probe],
    sizes: Sequence[int],
    margin: float,
    multiple_of: int,
    refine: int,
) -> Headroom:
    """Probe `sizes` in order (those at or above a size that ran out are skipped), then up to
    `refine` more sizes: growing until one runs out, then bisecting between the largest that
    fitted and the smallest that did not, until they are adjacent multiples of
    `multiple_of`. The fit through the sizes that fitted only chooses where to probe.

    Raises:
        MemdocError: see `probe` (through `run`).
    """
    probes: list[Probe] = []
    for size in sizes:
        if any(not p.fits(margin) and p.size <= size for p in probes):
            continue
        probes.append(run(size))
    in_bracket = 0
    for _ in range(refine):
        outcomes = [Outcome(p.size, p.fits(margin)) for p in probes]
        bracket = Bracket.of(outcomes)
        fit = _fit(probes, margin, multiple_of, bracket.too_big)
        closed_in = bracket.fits is not None and bracket.too_big is not None
        following = next_size(
            outcomes,
            multiple_of,
            predicted=fit.largest_size if fit is not None else None,
            use_fit=in_bracket % 2 == 0,
        )
        if following is None:
            break
        in_bracket += closed_in
        probes.append(run(following))
    return _answer(probes, margin, multiple_of)


def _fit(
    probes: Sequence[Probe], margin: float, multiple_of: int, too_big: int | None
) -> HeadroomFit | None:
    """The robust line through every size that fitted, against the tightest limit seen."""
    readings = [p.reading for p in probes if p.reading is not None]
    if not readings:
        return None
    limit = min(readings, key=lambda r: r.limit_bytes).limit_bytes
    points = [
        SizePeak(p.size, p.reading.peak_bytes)
        for p in probes
        if p.fits(margin) and p.reading is not None
    ]
    return fit_headroom(points, limit, margin=margin, multiple_of=multiple_of, below=too_big)


def _answer(probes: Sequence[Probe], margin: float, multiple_of: int) -> Headroom:
    outcomes = [Outcome(p.size, p.fits(margin)) for p in probes]
    bracket = Bracket.of(outcomes)
    readings = [p.reading for p in probes if p.reading is not None]
    tightest = min(readings, key=lambda r: r.limit_bytes) if readings else None
    notes = []
    for p in probes:
        if p.oom:
            notes.append(f"size {p.size} ran out of memory while probing")
        elif p.crashed:
            notes.append(
                f"size {p.size} was killed by signal {crash_signal(p.status)} with no "
                "out-of-memory error recorded, above a size that trained: taken for running out"
            )
        elif not p.fits(margin):
            notes.append(f"size {p.size} trained, but over the share of the limit kept free")
    if bracket.fits is not None and any(not o.fits and o.size < bracket.fits for o in outcomes):
        notes.append(
            "a size ran out below one that trained: runs differ near the limit, so the "
            "answer is under the smallest size that did not fit"
        )
    return Headroom(
        probes=tuple(probes),
        fit=_fit(probes, margin, multiple_of, bracket.too_big),
        limit_label=tightest.limit_label if tightest else "no limit recorded",
        limit_bytes=tightest.limit_bytes if tightest else None,
        margin=margin,
        multiple_of=multiple_of,
        largest_size=bracket.answer(outcomes, multiple_of),
        too_big=bracket.too_big,
        notes=tuple(notes),
    )


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.strip() and not line.startswith("memdoc:"):
            return line.strip()[:300]
    return ""
