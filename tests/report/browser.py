"""Headless Chromium for report tests: dump the DOM after scripts ran, or take a screenshot.

Run as a script to refresh the README picture:
    python -m tests.report.browser docs/report.png
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# No profile sync, no updates, no first-run pages: the browser itself stays offline too, so
# anything in its log about a refused load can only come from the page.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--mute-audio",
    # Any host name resolves to nothing: a request the page might make cannot leave.
    "--host-resolver-rules=MAP * ~NOTFOUND",
)
TIMEOUT_S = 90


def find_chromium() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class Page:
    dom: str  # the DOM after the page's scripts ran
    log: str  # the browser's stderr, with console messages


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("chromium is not installed")
    with tempfile.TemporaryDirectory(prefix="memdoc-chromium-") as profile:
        cmd = [chromium, *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def open_page(html: Path) -> Page:
    """Load a report from disk, let its scripts run, and return the resulting DOM and log."""
    done = _run(["--enable-logging=stderr", "--v=0", "--dump-dom", html.resolve().as_uri()])
    return Page(dom=done.stdout, log=done.stderr)


def screenshot(html: Path, png: Path, *, width: int = 1400, height: int = 2000) -> None:
    done = _run(
        [
            f"--screenshot={png.resolve()}",
            f"--window-size={width},{height}",
            html.resolve().as_uri(),
        ]
    )
    if not png.exists():
        raise RuntimeError(f"no screenshot: {done.stderr[-2000:]}")


def _main(out: Path) -> None:
    from memdoc.report.html import render_html
    from memdoc.rules.engine import diagnose_run
    from memdoc.trace import load_run
    from tests.report.traces import write_oom_run

    out = out.resolve()
    with tempfile.TemporaryDirectory() as folder:
        # Relative names, as a user would type them: the page shows the trace's name only.
        os.chdir(folder)
        run = load_run([write_oom_run(Path("train.memdoc"))])
        page = Path("train.html")
        page.write_text(render_html(run, diagnose_run(run)), encoding="utf-8")
        screenshot(page, out)


if __name__ == "__main__":
    _main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/report.png"))
