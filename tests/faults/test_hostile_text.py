"""Hostile text in a trace, a log or an error reaches every view shown, never obeyed."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdoc.printable import printable
from memdoc.report.html import write_report
from memdoc.report.summary import print_end_of_run
from memdoc.trace import load_trace
from memdoc.tui.app import make_app
from memdoc.tui.sources import ReplaySource
from tests.conftest import run_memdoc
from tests.faults.cli_in_process import memdoc
from tests.faults.hostile_traces import ATTACKS, raw_controls, write_hostile_trace
from tests.tui.conftest import ManualClock, wait_for

ALL_AT_ONCE = "".join(ATTACKS.values())
ATTACK_PARAMS = [pytest.param(s, id=name) for name, s in ATTACKS.items()]
MARKUP_ATTACKS = [ATTACKS["rich-markup"], ATTACKS["rich-link"]]
OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 226.00 MiB. GPU 0 has a "
    "total capacity of 15.58 GiB of which 71.25 MiB is free."
)
# Pieces hypothesis combines: the attacks, and any text at all.
hostile_strings = st.lists(
    st.one_of(st.sampled_from(list(ATTACKS.values())), st.text(max_size=20)), max_size=5
).map("".join)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("\x1b[2J", "\\x1b[2J", id="csi-shown-as-escape-text"),
        pytest.param("\x9b31m", "\\x9b31m", id="c1-csi"),
        pytest.param("a\x07b", "a\\x07b", id="bell"),
        pytest.param("\x1b]52;c;eA==\x07", "\\x1b]52;c;eA==\\x07", id="osc52"),
        pytest.param("caf\udce9", "caf\ufffd", id="undecodable-byte"),
        pytest.param("a\nb\tc", "a\\x0ab\\x09c", id="one-line-fields-keep-one-line"),
        pytest.param("\u202eevil", "\\u202eevil", id="bidi-override"),
        pytest.param("[bold]café ✓[/bold]", "[bold]café ✓[/bold]", id="ordinary-text-as-is"),
    ],
)
def test_printable_shows_control_characters_as_escapes(text: str, expected: str) -> None:
    assert printable(text) == expected


def test_printable_keeps_lines_of_a_multi_line_text_when_asked() -> None:
    assert printable("a\n\tb\x1b", keep_lines=True) == "a\n\tb\\x1b"


def test_printable_output_is_printable_again_unchanged() -> None:
    once = printable(ALL_AT_ONCE)
    assert printable(once) == once
    assert not raw_controls(once)


@pytest.mark.parametrize("attack", ATTACK_PARAMS)
def test_diagnose_shows_hostile_trace_text_without_obeying_it(tmp_path: Path, attack: str) -> None:
    trace = write_hostile_trace(tmp_path / "run.memdoc", attack)

    said = memdoc("diagnose", str(trace))

    assert said.status == 3, said.stderr  # 3: a memory problem found
    assert not raw_controls(said.stdout + said.stderr)


@pytest.mark.parametrize("attack", MARKUP_ATTACKS)
def test_diagnose_shows_rich_markup_as_written(tmp_path: Path, attack: str) -> None:
    trace = write_hostile_trace(tmp_path / "run.memdoc", attack)

    said = memdoc("diagnose", str(trace))

    assert attack in said.stdout


def test_diagnose_json_keeps_the_text_exactly_and_escapes_it(tmp_path: Path) -> None:
    trace = write_hostile_trace(tmp_path / "run.memdoc", ALL_AT_ONCE)

    said = memdoc("diagnose", "--json", str(trace))

    assert said.status == 3  # 3: a memory problem found
    assert not raw_controls(said.stdout)
    assert ALL_AT_ONCE in json.loads(said.stdout)["oom"]["message"]


def test_the_end_of_run_summary_shows_hostile_text_without_obeying_it(tmp_path: Path) -> None:
    trace = write_hostile_trace(tmp_path / "run.memdoc", ALL_AT_ONCE)
    stream = io.StringIO()

    print_end_of_run([trace], stream=stream)

    assert "Ran out of GPU memory" in stream.getvalue()
    assert not raw_controls(stream.getvalue())


@pytest.mark.parametrize("attack", ATTACK_PARAMS)
def test_explain_shows_a_hostile_error_text_without_obeying_it(tmp_path: Path, attack: str) -> None:
    log = tmp_path / "crash.log"
    log.write_bytes(f"{attack}\n{OOM_LINE} {attack}\n".encode("utf-8", "surrogatepass"))

    said = memdoc("explain", str(log))

    assert said.status == 3, said.stderr  # 3: a memory problem found
    assert not raw_controls(said.stdout + said.stderr)


def test_the_html_report_escapes_hostile_text(tmp_path: Path) -> None:
    trace = write_hostile_trace(tmp_path / "run.memdoc", ALL_AT_ONCE)
    out = tmp_path / "run.html"

    said = memdoc("report", str(trace), "-o", str(out))

    assert said.status == 0, said.stderr
    page = out.read_text(encoding="utf-8")
    assert ATTACKS["html-script"] not in page
    assert "<img src=x onerror" not in page


def test_an_error_line_shows_a_hostile_file_name_without_obeying_it(tmp_path: Path) -> None:
    said = memdoc("diagnose", str(tmp_path / f"{ATTACKS['osc52-clipboard']}.memdoc"))

    assert said.status != 0
    assert said.one_clear_error()
    assert not raw_controls(said.stderr)


def test_info_shows_a_hostile_environment_value_without_obeying_it() -> None:
    hostile = ATTACKS["csi-clear-screen"] + ATTACKS["osc52-clipboard"]
    done = run_memdoc("info", env={"PYTORCH_CUDA_ALLOC_CONF": hostile})

    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "PYTORCH_CUDA_ALLOC_CONF=\\x1b[2J" in out
    assert not raw_controls(out)


async def _dashboard_screen(trace: Path, log: Path) -> str:
    """Everything the replay dashboard draws at the OOM, as its screenshot holds it."""
    source = ReplaySource(load_trace(trace), clock=ManualClock(), paused=True, start_s=3.5)
    app = make_app(source, log_path=log)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: app.view is not None and app.view.oom is not None)
        await pilot.pause(0.3)
        app.notify(f"written to {ATTACKS['rich-markup']}{ATTACKS['csi-clear-screen']}")
        await pilot.pause(0.3)
        return app.export_screenshot()


def test_the_dashboard_shows_hostile_trace_and_log_text_without_obeying_it(
    tmp_path: Path,
) -> None:
    trace = write_hostile_trace(tmp_path / "run.memdoc", ALL_AT_ONCE)
    log = tmp_path / "run.log"
    log.write_bytes(f"step 1 {ALL_AT_ONCE}\n".encode("utf-8", "surrogatepass") + b"caf\xe9\n")

    screen = asyncio.run(_dashboard_screen(trace, log))

    assert not raw_controls(screen)
    assert "\\x1b[2J" in screen
    # The SVG holds spaces as &#160;: the markup is there as written, not interpreted.
    assert "[bold&#160;red]shout" in screen


def _page(trace: Path) -> str:
    out = trace.with_suffix(".html")
    out.unlink(missing_ok=True)
    write_report([trace], out)
    return out.read_text(encoding="utf-8")


_EVENT_HANDLER_IN_A_TAG = re.compile(r"<[a-z][^<>]*\son[a-z]+\s*=", re.IGNORECASE)


def _markup_count(page: str) -> tuple[int, ...]:
    """What HTML injection would add to: tags that run code or load things, and handlers."""
    lowered = page.lower()
    tags = tuple(lowered.count(s) for s in ("<script", "<img", "<iframe", "<a ", "href="))
    return (*tags, len(_EVENT_HANDLER_IN_A_TAG.findall(page)))


@pytest.fixture(scope="module")
def benign_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("benign")
    return _page(write_hostile_trace(folder / "benign.memdoc", "benign"))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=hostile_strings)
def test_no_hostile_string_in_any_trace_field_is_obeyed_by_any_view(
    tmp_path: Path, benign_page: str, hostile: str
) -> None:
    """Diagnose (text and JSON), the end-of-run summary, explain and the HTML report."""
    trace = write_hostile_trace(tmp_path / "fuzz.memdoc", hostile)
    log = tmp_path / "fuzz.log"
    log.write_bytes(f"{hostile}\n{OOM_LINE} {hostile}\n".encode("utf-8", "surrogatepass"))
    try:
        diagnosis = memdoc("diagnose", str(trace))
        as_json = memdoc("diagnose", "--json", str(trace))
        explained = memdoc("explain", str(log))
        summary = io.StringIO()
        print_end_of_run([trace], stream=summary)
        page = _page(trace)
    finally:
        trace.unlink()

    for said in (diagnosis, as_json, explained):
        assert said.status == 3, said.stderr  # 3: a memory problem found
        assert not raw_controls(said.stdout + said.stderr)
    assert not raw_controls(summary.getvalue())
    json.loads(as_json.stdout)
    assert _markup_count(page) == _markup_count(benign_page)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=hostile_strings)
def test_no_hostile_string_in_any_trace_field_is_obeyed_by_the_dashboard(
    tmp_path: Path, hostile: str
) -> None:
    """The replay dashboard (`memdoc live --replay` is this app over this source)."""
    trace = write_hostile_trace(tmp_path / "fuzz.memdoc", hostile)
    log = tmp_path / "fuzz.log"
    log.write_bytes(f"{hostile}\n".encode("utf-8", "surrogatepass"))
    try:
        screen = asyncio.run(_dashboard_screen(trace, log))
    finally:
        trace.unlink()

    assert not raw_controls(screen)


def test_report_and_import_show_a_hostile_output_name_without_obeying_it(
    tmp_path: Path, fixtures: Path
) -> None:
    name = ATTACKS["csi-clear-screen"] + ATTACKS["c1-csi"]
    smi = fixtures / "importers/nvidia-smi-captures/linux-x86_64__nvidia-h200__590.48.01.txt"
    trace = tmp_path / f"{name}.memdoc"

    imported = memdoc("import", str(smi), "-o", str(trace))
    reported = memdoc("report", str(trace), "-o", str(tmp_path / f"{name}.html"))

    for said in (imported, reported):
        assert said.status == 0, said.stderr
        assert "\\x1b[2J" in said.stdout
        assert not raw_controls(said.stdout + said.stderr)


def test_a_hostile_unknown_option_is_shown_without_being_obeyed() -> None:
    done = run_memdoc("diagnose", "run.memdoc", "--" + ATTACKS["osc52-clipboard"])

    assert done.returncode == 2
    assert b"unrecognized arguments" in done.stderr
    assert not raw_controls(done.stderr.decode())
