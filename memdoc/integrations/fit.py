"""One recorded fit: the watch a training-framework callback opens, steps, marks and closes."""

from __future__ import annotations

import atexit
import io
import os
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from memdoc.api import default_trace_path, watch
from memdoc.session import DEFAULT_INTERVAL_S


class FitRecording:
    """The trace of one fit. Callbacks forward the framework's hooks here.

    The watch is opened at fit start and closed at fit end, or when an exception ends the
    fit: the exception is recorded (an OOM with its parsed fields), the diagnosis is printed
    once to stderr and kept in `diagnosis`; the exception itself is left to propagate.
    """

    def __init__(
        self,
        prefix: str,
        path: str | os.PathLike[str] | None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        quiet: bool = False,
    ) -> None:
        self.prefix = prefix
        self.asked_path = Path(path) if path is not None else None
        self.interval_s = interval_s
        self.quiet = quiet
        self.path: Path | None = None
        self.summary: str | None = None
        self.diagnosis: str | None = None
        self._watch: watch | None = None
        self._lock = threading.Lock()
        self._previous_excepthook: Any = None

    @property
    def active(self) -> bool:
        return self._watch is not None

    def one_trace_per_rank(self, rank: int | str) -> None:
        """On a rank other than 0: the asked name with the rank in it, one trace per process
        (a fresh name has the PID in it already)."""
        asked = self.asked_path
        if asked is not None:
            self.asked_path = asked.with_name(f"{asked.stem}-rank{rank}{asked.suffix}")

    def start(self) -> None:
        """Open the trace (a fresh name unless one was given); a second start is ignored."""
        with self._lock:
            if self._watch is not None:
                return
            path = self.asked_path or default_trace_path(tag=self.prefix)
            recording = watch(path, interval=self.interval_s, quiet=True)
            recording._loops = False  # the callback reports its loop's steps and phases
            recording.__enter__()  # never raises: it warns and the fit runs unobserved
            if recording.session is None:
                return
            self._watch = recording
            self.path = recording.path
            self.summary = None
            self.diagnosis = None
        self._install_excepthook()
        # A fit whose error the program caught, without telling the callback, is never
        # closed by the framework: it is closed when the interpreter exits.
        atexit.register(self.finish)

    def step(self, **data: Any) -> None:
        recording = self._watch
        if recording is not None:
            recording.step(**data)

    def mark(self, label: str, **data: Any) -> None:
        recording = self._watch
        if recording is not None:
            recording.mark(label, **data)

    def finish(self, exc: BaseException | None = None) -> None:
        """Close the trace, recording `exc` when it ended the fit; print the outcome once."""
        with self._lock:
            recording, self._watch = self._watch, None
        if recording is None:
            return
        atexit.unregister(self.finish)
        self._remove_excepthook()
        tb: TracebackType | None = exc.__traceback__ if exc is not None else None
        try:
            recording.__exit__(type(exc) if exc is not None else None, exc, tb)
        except Exception as error:
            print(f"memdoc: warning: {recording.path}: {error}", file=sys.stderr)
            return
        text = _summary_text(recording.path)
        self.summary = text
        if exc is not None:
            self.diagnosis = text
        if text and not self.quiet:
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
            sys.stderr.flush()

    # An exception that leaves `fit` gives these frameworks no hook (Keras, the Hugging
    # Face Trainer): when nobody catches it, the interpreter's excepthook still sees it.
    def _install_excepthook(self) -> None:
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook

    def _remove_excepthook(self) -> None:
        if sys.excepthook == self._excepthook and self._previous_excepthook is not None:
            sys.excepthook = self._previous_excepthook
        self._previous_excepthook = None

    def _excepthook(
        self,
        exc_type: type[BaseException],
        exc: BaseException,
        tb: TracebackType | None,
    ) -> None:
        previous = self._previous_excepthook or sys.__excepthook__
        previous(exc_type, exc, tb)  # the traceback first, as without memdoc
        self.finish(exc)


class RecordsFit:
    """What every training-framework callback shares: its recording, where the trace went,
    the diagnosis once the fit ended, and `finish`. Mixed in before the framework's base."""

    recording: FitRecording

    def _record(
        self,
        prefix: str,
        path: str | os.PathLike[str] | None,
        *,
        interval_s: float,
        quiet: bool,
    ) -> None:
        self.recording = FitRecording(prefix, path, interval_s=interval_s, quiet=quiet)

    @property
    def path(self) -> Path | None:
        """The trace, once the fit started."""
        return self.recording.path

    @property
    def diagnosis(self) -> str | None:
        """What memdoc printed when an exception ended the fit."""
        return self.recording.diagnosis

    @property
    def summary(self) -> str | None:
        """What memdoc said when the fit ended, well or not (with `quiet=True` too): the
        diagnosis, or the quiet line; None before the fit ended."""
        return self.recording.summary

    def finish(self, exc: BaseException | None = None) -> None:
        """Close the trace now, recording `exc` as what ended training."""
        self.recording.finish(exc)


def _summary_text(path: Path) -> str:
    from memdoc.report.summary import print_end_of_run

    stream = io.StringIO()
    try:
        print_end_of_run([path], stream=stream)
    except Exception as exc:
        return f"memdoc: trace written to {path} (no summary: {exc})\n"
    return stream.getvalue()
