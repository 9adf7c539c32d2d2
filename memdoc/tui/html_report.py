"""The `r` key: run `memdoc report` on the shown trace in a subprocess and open the result."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import webbrowser
from pathlib import Path

from memdoc.tui.sources import SampleSource

REPORT_TIMEOUT_S = 300.0
MAX_REPORT_NAMES = 1000


def report_path_of(source: SampleSource) -> Path | None:
    """The trace file behind a source, when there is one to report on."""
    path = getattr(source, "path", None)
    if path is None:
        trace = getattr(source, "trace", None)
        path = getattr(trace, "path", None)
    return Path(path) if path is not None and Path(path).is_file() else None


def write_report(trace_path: Path) -> tuple[Path | None, str | None]:
    """Write the HTML report beside the trace (`run.html`, or `run-1.html`... when one is
    there already: never over a file of the user's); in a temporary folder when the trace's
    folder cannot be written.

    Returns the report's absolute path (a file URI needs one; the trace's may be relative,
    such as the default name), or None and the first line of the command's complaint.
    """
    out = _free_report_path(trace_path.absolute())
    command = [sys.executable, "-m", "memdoc", "report", str(trace_path), "-o", str(out)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=REPORT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"memdoc report did not finish: {exc}"
    if done.returncode != 0 or not out.is_file():
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        return None, lines[0] if lines else f"memdoc report exited with {done.returncode}"
    return out, None


def _free_report_path(trace_path: Path) -> Path:
    folder = trace_path.parent
    if not os.access(folder, os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="memdoc-report-"))
    stem = trace_path.stem
    for number in range(MAX_REPORT_NAMES):
        name = f"{stem}.html" if number == 0 else f"{stem}-{number}.html"
        if not (folder / name).exists():
            return folder / name
    return Path(tempfile.mkdtemp(prefix="memdoc-report-")) / f"{stem}.html"


def open_in_browser(uri: str) -> bool:
    """Open `uri` in a graphical browser; False where there is none (a server, ssh).

    Text browsers would fight the dashboard for the terminal, so without a display (or an
    explicit BROWSER) nothing is opened and the caller shows the path instead.
    """
    if sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("BROWSER")
    ):
        return False
    try:
        return webbrowser.open(uri)
    except webbrowser.Error:
        return False
