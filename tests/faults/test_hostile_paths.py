"""Output paths another user could aim: planted links at temporary and output paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memdoc.errors import MemdocError
from memdoc.files import write_atomically
from memdoc.importers.build import TraceBuilder, save_trace
from tests.conftest import run_memdoc
from tests.faults.cli_in_process import memdoc

VICTIM_TEXT = "the victim's own file\n"
NOBODY_UID = 65534


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file in another folder, the one an attacker wants overwritten."""
    elsewhere = tmp_path / "victim-home"
    elsewhere.mkdir()
    path = elsewhere / "precious.txt"
    path.write_text(VICTIM_TEXT)
    return path


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def _plant_foreign_link(link: Path, target: Path) -> None:
    """A symbolic link that user `nobody` owns (as an attacker in a shared folder would)."""
    if os.geteuid() != 0:
        pytest.skip("making a link owned by another user needs root")
    link.symlink_to(target)
    os.lchown(link, NOBODY_UID, NOBODY_UID)


def _old_temporary_name(out: Path) -> Path:
    """The predictable temporary name memdoc once used beside its output."""
    return out.with_name(f".{out.name}.{os.getpid()}.tmp")


def test_write_atomically_never_follows_a_link_planted_at_its_temporary_path(
    shared: Path, victim: Path
) -> None:
    out = shared / "report.html"
    _plant_foreign_link(_old_temporary_name(out), victim)

    write_atomically(out, "<html>report</html>")

    assert victim.read_text() == VICTIM_TEXT
    assert out.read_text() == "<html>report</html>"
    assert not out.is_symlink()


def test_save_trace_never_follows_a_link_planted_at_its_temporary_path(
    shared: Path, victim: Path
) -> None:
    out = shared / "imported.memdoc"
    _plant_foreign_link(_old_temporary_name(out), victim)
    builder = TraceBuilder()
    builder.values(1_700_000_000.0, {})

    save_trace(builder.build(), out)

    assert victim.read_text() == VICTIM_TEXT
    assert out.read_text().startswith('{"type":"header"')


def test_write_atomically_refuses_an_output_that_is_another_users_link(
    shared: Path, victim: Path
) -> None:
    out = shared / "report.html"
    _plant_foreign_link(out, victim)

    with pytest.raises(MemdocError, match="symbolic link owned by another user"):
        write_atomically(out, "<html>report</html>")

    assert victim.read_text() == VICTIM_TEXT


def test_import_with_force_refuses_an_output_that_is_another_users_link(
    shared: Path, victim: Path, fixtures: Path
) -> None:
    out = shared / "run.memdoc"
    _plant_foreign_link(out, victim)
    smi_log = (
        fixtures / "importers" / "nvidia-smi-captures" / "linux-x86_64__nvidia-h200__590.48.01.txt"
    )

    said = memdoc("import", str(smi_log), "-o", str(out), "--force")

    assert said.status == 2
    assert said.one_clear_error()
    assert "symbolic link owned by another user" in said.stderr
    assert victim.read_text() == VICTIM_TEXT


def test_report_with_force_refuses_an_output_that_is_another_users_link(
    shared: Path, victim: Path, fixtures: Path
) -> None:
    trace = shared / "run.memdoc"
    smi_log = (
        fixtures / "importers" / "nvidia-smi-captures" / "linux-x86_64__nvidia-h200__590.48.01.txt"
    )
    assert memdoc("import", str(smi_log), "-o", str(trace)).status == 0
    out = shared / "run.html"
    _plant_foreign_link(out, victim)

    said = memdoc("report", str(trace), "-o", str(out), "--force")

    assert said.status == 2
    assert said.one_clear_error()
    assert victim.read_text() == VICTIM_TEXT


def test_live_run_never_overwrites_an_existing_log_without_force(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    program.write_text("print('hello')\n")
    log = tmp_path / "out.log"
    log.write_text(VICTIM_TEXT)

    done = run_memdoc("run", "--live", "-o", str(tmp_path / "out.memdoc"), str(program))

    assert done.returncode == 2
    assert b"out.log exists" in done.stderr
    assert b"Traceback" not in done.stderr
    assert log.read_text() == VICTIM_TEXT
    assert not (tmp_path / "out.memdoc").exists()


def test_live_run_with_force_refuses_a_log_that_is_another_users_link(
    shared: Path, victim: Path
) -> None:
    program = shared / "prog.py"
    program.write_text("print('hello')\n")
    _plant_foreign_link(shared / "out.log", victim)

    done = run_memdoc("run", "--live", "--force", "-o", str(shared / "out.memdoc"), str(program))

    assert done.returncode == 2
    assert b"symbolic link owned by another user" in done.stderr
    assert victim.read_text() == VICTIM_TEXT


def test_trace_writer_with_force_replaces_a_link_instead_of_following_it(
    tmp_path: Path, victim: Path
) -> None:
    out = tmp_path / "mine.memdoc"
    out.symlink_to(victim)  # the user's own link: replaced, the file it names untouched
    program = tmp_path / "prog.py"
    program.write_text("print('hello')\n")

    done = run_memdoc("run", "-q", "--force", "--no-nvml", "-o", str(out), str(program))

    assert done.returncode == 0, done.stderr
    assert victim.read_text() == VICTIM_TEXT
    assert not out.is_symlink()


def test_write_atomically_gives_the_output_the_mode_of_any_new_file(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    umask = 0o027
    previous = os.umask(umask)
    try:
        write_atomically(out, "<html></html>")
    finally:
        os.umask(previous)

    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
