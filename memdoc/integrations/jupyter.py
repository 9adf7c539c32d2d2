"""IPython magics: `%%memdoc` watches a cell and shows its diagnosis; `%memdoc_report`."""

from __future__ import annotations

import html
import re
import shlex
from pathlib import Path
from types import TracebackType
from typing import Any

from memdoc.integrations.fit import FitRecording

USAGE = "usage: %%memdoc [TRACE] [--report]"
REPORT_USAGE = "usage: %memdoc_report [TRACE]"
_ANSI_STYLE = re.compile(r"\x1b\[[0-9;]*m")
try:
    from IPython.core import interactiveshell as _interactiveshell

    _IPYTHON_RUNNER: str | None = _interactiveshell.__file__
except ImportError:  # pragma: no cover - the magics need IPython anyway
    _IPYTHON_RUNNER = None


class Magics:
    """The magics' state: the last trace recorded in this kernel."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.last_trace: Path | None = None

    def cell(self, line: str, cell: str) -> None:
        """Run the cell under a watch, then show the diagnosis (and the report's link).

        The cell's own error is raised again once the diagnosis is shown, so that the
        kernel reports it as it would without the magic (nbclient and papermill stop).
        """
        words = _words(line, USAGE)
        if words is None:
            return
        report = "--report" in words
        names = [w for w in words if w != "--report"]
        if len(names) > 1 or any(n.startswith("-") for n in names):
            _show_text(f"memdoc: unexpected arguments {line!r}; {USAGE}")
            return
        recording = FitRecording("jupyter", names[0] if names else None, quiet=True)
        recording.start()
        error = _run_quietly(self.shell, cell)
        recording.finish(error)
        if recording.path is not None:
            self.last_trace = recording.path
            if recording.summary:
                _show_diagnosis(recording.summary)
            if report:
                self.report(str(recording.path))
        if error is not None:
            __tracebackhide__ = True  # IPython shows the cell's frames, not this one
            raise error.with_traceback(_user_frames(error.__traceback__))

    def report(self, line: str) -> None:
        """Write the HTML report beside the trace (the cell's last one by default); link it."""
        words = _words(line, REPORT_USAGE)
        if words is None:
            return
        if len(words) > 1:
            _show_text(f"memdoc: unexpected arguments {line!r}; {REPORT_USAGE}")
            return
        trace = Path(words[0]) if words else self.last_trace
        if trace is None:
            _show_text(f"memdoc: no trace recorded yet in this kernel; {REPORT_USAGE}")
            return
        from memdoc.errors import MemdocError
        from memdoc.report.html import write_report

        output = _report_path(trace)
        try:
            write_report([trace], output, force=True)
        except MemdocError as exc:
            _show_text(f"memdoc: {exc.message}")
            return
        _show_link(output)


def _words(line: str, usage: str) -> list[str] | None:
    """The magic's arguments as a shell splits them; None (said in the output) when they
    cannot be split, such as an unclosed quote."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        _show_text(f"memdoc: {exc} in {line!r}; {usage}")
        return None


def _run_quietly(shell: Any, cell: str) -> BaseException | None:
    """Run the cell as IPython runs any cell; its error, if any, is returned instead of
    shown, so that it is shown once, by the kernel, as the magic's cell's own error."""
    shown = shell.showtraceback, shell.showsyntaxerror
    shell.showtraceback = shell.showsyntaxerror = _hidden
    try:
        result = shell.run_cell(cell)
    finally:
        shell.showtraceback, shell.showsyntaxerror = shown
    if result is None:
        return None
    error: BaseException | None = result.error_before_exec or result.error_in_exec
    return error


def _hidden(*args: Any, **kwargs: Any) -> None:
    del args, kwargs


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the cell's own code on (IPython's frame that ran it left out)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == _IPYTHON_RUNNER:
        tb = tb.tb_next
    return tb


def _report_path(trace: Path) -> Path:
    path = trace.with_suffix("") if trace.suffix == ".gz" else trace
    return path.with_suffix(".html")


def _show_text(text: str) -> None:
    from IPython.display import display

    display(_Rich(text, f"<pre>{html.escape(text)}</pre>"))


def _show_diagnosis(text: str) -> None:
    from IPython.display import display

    text = _ANSI_STYLE.sub("", text)  # the kernel sets FORCE_COLOR: the summary has colours
    markup = f'<pre style="white-space: pre-wrap">{html.escape(text)}</pre>'
    display(_Rich(text, markup))


def _show_link(report: Path) -> None:
    from IPython.display import display

    # A link, not an embedded copy: the self-contained report is megabytes of Plotly,
    # which would be stored in the notebook at every run.
    href = html.escape(str(report), quote=True)
    text = f"memdoc: report written to {report}"
    display(_Rich(text, f'<a href="{href}" target="_blank">{html.escape(text)}</a>'))


class _Rich:
    """An object IPython displays as plain text, or as HTML where the front end can."""

    def __init__(self, text: str, markup: str) -> None:
        self.text = text
        self.markup = markup

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.markup


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext memdoc`: register `%%memdoc` and `%memdoc_report`."""
    magics = Magics(shell)
    shell.register_magic_function(magics.cell, magic_kind="cell", magic_name="memdoc")
    shell.register_magic_function(magics.report, magic_kind="line", magic_name="memdoc_report")
