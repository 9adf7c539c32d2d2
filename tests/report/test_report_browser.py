"""Reports opened in a real headless Chromium: plots draw, nothing loads, nothing injected runs.

How "no network request" is checked, three ways that do not need a server:
1. the page declares a Content-Security-Policy of `default-src 'none'`, so the browser itself
   refuses any load (image, script, font, fetch) and says so on the console;
2. Chromium runs with console logging on and a host resolver that resolves nothing, and the
   test asserts its log holds no CSP violation and no uncaught script error;
3. the DOM after the scripts ran (`--dump-dom`) shows every figure drawn by plotly.js
   (`class="plot-container plotly"` with its SVG), which could not happen if plotly.js had
   been expected from a CDN.
The static side (no `src`/`href` pointing off the page) is checked in test_report_html.py.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memdoc.report.html import render_html
from memdoc.rules.engine import diagnose_run
from memdoc.trace import Run, load_run
from tests.report.browser import Page, find_chromium, open_page
from tests.report.traces import (
    million_value_trace,
    write_clean_h200_run,
    write_oom_run,
    write_rank_traces,
)

pytestmark = [
    pytest.mark.browser,
    # One worker runs the module: the reports are opened in browsers once, not per worker.
    pytest.mark.xdist_group("browser-reports"),
    pytest.mark.skipif(
        find_chromium() is None,
        reason="needs a headless Chromium: apt-get install chromium",
    ),
]

PLOT = re.compile(r'<div class="plot-container plotly"')
# Each payload would leave a trace in the DOM if it ran.
PAYLOADS = (
    "<script>document.title='pwned'</script>",
    "</script><script>document.body.setAttribute('data-pwned','1')</script>",
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">",
    "<!--",
)


def _write(run: Run, out: Path) -> Path:
    out.write_text(render_html(run, diagnose_run(run)), encoding="utf-8")
    return out


def _hostile_oom_report(folder: Path) -> Path:
    """The OOM scenario, with script payloads in the command line and in a mark's label."""
    command = ("train.py", *PAYLOADS)
    trace = write_oom_run(folder / "run.memdoc", command=command, mark=" ".join(PAYLOADS))
    return _write(load_run([trace]), folder / "run.html")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Page]:
    """Every report opened once; the browsers run side by side to keep the suite quick."""
    folder = tmp_path_factory.mktemp("reports")
    for name in ("oom", "clean", "ranks", "big"):
        (folder / name).mkdir()
    files = {
        "oom": _hostile_oom_report(folder / "oom"),
        "clean": _write(
            load_run([write_clean_h200_run(folder / "clean" / "run.memdoc", devices=2)]),
            folder / "clean" / "run.html",
        ),
        "ranks": _write(
            load_run(write_rank_traces(folder / "ranks")), folder / "ranks" / "run.html"
        ),
        "big": _write(Run([million_value_trace()]), folder / "big" / "run.html"),
    }
    with ThreadPoolExecutor(max_workers=len(files)) as pool:
        opened = dict(zip(files, pool.map(open_page, files.values()), strict=True))
    return opened


def _assert_clean_load(page: Page, figures: int) -> None:
    assert len(PLOT.findall(page.dom)) == figures, "every figure drawn"
    assert page.dom.count('class="main-svg"') >= figures
    console = [line for line in page.log.splitlines() if ":CONSOLE" in line]
    assert not [line for line in console if "Content Security Policy" in line], console
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console


def test_an_oom_report_draws_its_plots_and_shows_findings(pages: dict[str, Page]) -> None:
    page = pages["oom"]

    _assert_clean_load(page, figures=3)  # ledger, timeline, per step
    assert "Ran out of GPU memory on GPU 0" in page.dom
    assert "Memory kept alive step after step" in page.dom
    assert "running_loss += loss.item()" in page.dom


def test_hostile_strings_from_the_trace_do_not_run(pages: dict[str, Page]) -> None:
    page = pages["oom"]

    assert "<title>memdoc · run.memdoc</title>" in page.dom, "the title payload did not run"
    assert not re.search(r"<body[^>]*data-pwned", page.dom), "the attribute payloads did not run"
    assert "&lt;/script&gt;&lt;script&gt;document.body" in page.dom, "shown as text instead"


def test_a_clean_multi_device_report_draws_every_gpu(pages: dict[str, Page]) -> None:
    page = pages["clean"]

    _assert_clean_load(page, figures=3)
    assert "No memory problem found in this run." in page.dom
    assert "GPU 1 · NVIDIA H200" in page.dom


def test_a_multi_rank_report_marks_the_rank_that_failed_first(pages: dict[str, Page]) -> None:
    page = pages["ranks"]

    _assert_clean_load(page, figures=4)  # ledger, timeline, per step, ranks
    assert re.search(r'rank 2 <span class="badge bad">failed first</span>', page.dom)


def test_a_one_million_value_report_opens_and_draws(pages: dict[str, Page]) -> None:
    _assert_clean_load(pages["big"], figures=3)
