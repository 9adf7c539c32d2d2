"""The HTML page as text: self-contained, escaped, small enough, and written safely."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from memdoc.errors import MemdocError, OutputExistsError
from memdoc.report.html import render_html, script_json, write_report
from memdoc.rules.engine import diagnose_run
from memdoc.trace import Run, load_run
from tests.report.traces import million_value_trace, write_host_only_run, write_oom_run

HOSTILE = "</script><script>document.title='pwned'</script><!-- \u2028 <img src=x onerror=alert(1)>"
# What a browser would fetch: src=, href=, url(...), @import, pointing off the page.
FETCHING = re.compile(
    r"""(?:\bsrc|\bhref)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""", re.I
)


def _page(path: Path) -> str:
    run = load_run([path])
    return render_html(run, diagnose_run(run))


@pytest.fixture(scope="module")
def oom_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _page(write_oom_run(tmp_path_factory.mktemp("oom") / "run.memdoc"))


def test_plotly_js_is_inline_once_and_nothing_is_fetched(oom_page: str) -> None:
    bundle = get_plotlyjs()
    assert oom_page.count(bundle) == 1
    # The bundle mentions map-tile and logo URLs that only map traces would use; the browser
    # test shows nothing is loaded at run time. Everything else on the page is ours.
    ours = oom_page.replace(bundle, "")
    assert ours.count("Plotly.newPlot") == 1, "one drawing loop in our script"
    assert ours.count("<script") == 3, "figures JSON, plotly.js, the report script"
    assert not re.search(r"<script[^>]*\bsrc=", ours)
    assert not re.search(r"<link\b", ours)
    assert not FETCHING.search(ours)
    assert "default-src 'none'" in ours, "the page forbids itself any load"


def test_findings_and_fixes_are_on_the_page(oom_page: str) -> None:
    assert "Memory kept alive step after step" in oom_page
    assert "running_loss += loss.item()" in oom_page
    assert oom_page.count('class="copy"') >= 2


def test_a_hostile_command_line_is_text_everywhere(tmp_path: Path) -> None:
    page = _page(write_oom_run(tmp_path / "run.memdoc", command=("train.py", HOSTILE)))

    assert "&lt;/script&gt;&lt;script&gt;document.title=" in page, "shown as text"
    assert "<img src=x" not in page
    # Exactly our own script elements open and close.
    assert len(re.findall(r"<script", page, re.I)) == 3
    assert len(re.findall(r"</script", page, re.I)) == 3


def test_embedded_json_cannot_close_its_script_or_break_lines() -> None:
    text = script_json({"label": HOSTILE})

    assert "</" not in text and "<!--" not in text
    assert "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == {"label": HOSTILE}


def test_a_host_only_trace_gives_a_full_page(tmp_path: Path) -> None:
    page = _page(write_host_only_run(tmp_path / "run.memdoc"))

    assert 'id="fig-timeline"' in page and 'id="fig-steps"' in page
    assert 'id="fig-ledger"' not in page
    assert "No GPU was recorded" in page
    assert "NVML not found" in page


def test_one_million_values_render_into_less_than_ten_megabytes() -> None:
    trace = million_value_trace()
    assert trace.values_read == 1_000_000
    run = Run([trace])

    started = time.perf_counter()
    page = render_html(run, diagnose_run(run))
    elapsed = time.perf_counter() - started

    print(f"\nreport of 1,000,000 values: {elapsed:.2f} s, {len(page) / 1e6:.1f} MB")
    assert len(page.encode()) < 10 * 1000 * 1000
    # The one spike of 30 GiB extra is still drawn.
    assert "70.00 GiB" in page


def test_write_report_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    trace = write_oom_run(tmp_path / "run.memdoc")
    out = tmp_path / "run.html"
    out.write_text("keep me")

    with pytest.raises(OutputExistsError):
        write_report([trace], out)
    assert out.read_text() == "keep me"

    write_report([trace], out, force=True)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "run.memdoc"]


def test_bad_input_leaves_no_output_behind(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n")

    with pytest.raises(MemdocError, match="notes.txt"):
        write_report([junk], tmp_path / "out.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
