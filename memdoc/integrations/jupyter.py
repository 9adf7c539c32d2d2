"""IPython magics: `%%memdoc` watches a cell and shows its diagnosis; `%memdoc_report`."""

from __future__ import annotations

import html
import shlex
from pathlib import Path
from typing import Any

from memdoc.integrations.fit import FitRecording

USAGE = "usage: %%memdoc [TRACE] [--report]"
REPORT_USAGE = "usage: %memdoc_report [TRACE]"


class Magics:
    """The magics' state: the last trace recorded in this kernel."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.last_trace: Path | None = None

    def cell(self, line: str, cell: str) -> None:
        """Run the cell under a watch, then show the diagnosis (and the report's link)."""
        try:
            words = shlex.split(line)
        except ValueError as exc:
            _show_text(f"memdoc: {exc}; {USAGE}")
            return
        report = "--report" in words
        names = [w for w in words if w != "--report"]
        if len(names) > 1 or any(n.startswith("-") for n in names):
            _show_text(f"memdoc: unexpected arguments {line!r}; {USAGE}")
            return
        recording = FitRecording("jupyter", names[0] if names else None, quiet=True)
        recording.start()
        result = self.shell.run_cell(cell)
        error = result.error_in_exec if result is not None else None
        recording.finish(error)
        if recording.path is None:
            return
        self.last_trace = recording.path
        _show_diagnosis(recording.summary or "")
        if report:
            self.report(str(recording.path))

    def report(self, line: str) -> None:
        """Write the HTML report beside the trace (the cell's last one by default); link it."""
        words = shlex.split(line) if line.strip() else []
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


def _report_path(trace: Path) -> Path:
    path = trace.with_suffix("") if trace.suffix == ".gz" else trace
    return path.with_suffix(".html")


def _show_text(text: str) -> None:
    from IPython.display import display

    display(  # type: ignore[no-untyped-call]
        _Rich(text, f"<pre>{html.escape(text)}</pre>")
    )


def _show_diagnosis(text: str) -> None:
    from IPython.display import display

    markup = f'<pre style="white-space: pre-wrap">{html.escape(text)}</pre>'
    display(  # type: ignore[no-untyped-call]
        _Rich(text, markup)
    )


def _show_link(report: Path) -> None:
    from IPython.display import display

    # A link, not an embedded copy: the self-contained report is megabytes of Plotly,
    # which would be stored in the notebook at every run.
    href = html.escape(str(report), quote=True)
    text = f"memdoc: report written to {report}"
    display(  # type: ignore[no-untyped-call]
        _Rich(text, f'<a href="{href}" target="_blank">{html.escape(text)}</a>')
    )


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
