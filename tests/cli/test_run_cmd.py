"""`memdoc run`'s options as a user types them: one report form that cannot eat the program."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_memdoc

HELLO = "print('hello from the program')\n"


@pytest.mark.parametrize(
    "exists", [pytest.param(False, id="new"), pytest.param(True, id="existing")]
)
def test_report_followed_by_an_html_path_is_refused_with_a_usage_line(
    tmp_path: Path, exists: bool
) -> None:
    (tmp_path / "train.py").write_text(HELLO)
    if exists:  # a report from an earlier run: still not a program
        (tmp_path / "out.html").write_text("print('the html file ran')\n")
    done = run_memdoc("run", "--report", "out.html", "train.py", cwd=tmp_path, timeout=60)
    stderr = done.stderr.decode()
    assert done.returncode == 2
    assert "out.html" in stderr and "--report-to out.html" in stderr
    assert "Traceback" not in stderr
    assert b"hello from the program" not in done.stdout  # nothing was run
    assert b"ran" not in done.stdout
    assert not list(tmp_path.glob("*.memdoc"))


def test_report_writes_the_html_beside_the_trace(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(HELLO)
    (tmp_path / "runs").mkdir()
    done = run_memdoc("run", "--report", "-o", "runs/t.memdoc", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "runs" / "t.html").is_file()
    assert "report runs/t.html" in done.stderr.decode()


def test_report_to_writes_the_html_where_it_is_told(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(HELLO)
    done = run_memdoc("run", "--report-to", "mine.html", "-o", "t.memdoc", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "mine.html").is_file()
    assert not (tmp_path / "t.html").exists()


def test_run_help_names_both_report_forms() -> None:
    done = run_memdoc("run", "--help", timeout=60)
    text = done.stdout.decode()
    assert "--report " in text and "--report-to FILE" in text
    assert "beside the trace" in text


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_a_program_ended_by_a_signal_is_reported_in_one_line(
    tmp_path: Path, signal_name: str
) -> None:
    (tmp_path / "die.py").write_text(
        f"import os, signal\nos.kill(os.getpid(), signal.{signal_name})\n"
    )
    done = run_memdoc("run", "-o", "t.memdoc", "die.py", cwd=tmp_path)
    stderr = done.stderr.decode()
    # memdoc dies of the signal the program died of, as python would have.
    assert done.returncode == -{"SIGKILL": 9, "SIGTERM": 15}[signal_name]
    said = [line for line in stderr.splitlines() if line.startswith("memdoc:")]
    assert len(said) == 1, stderr
    assert f"by {signal_name} (signal {-done.returncode})" in said[0]


KIDS = """\
import subprocess, sys
for _ in range(3):
    subprocess.run([sys.executable, "-c", "print('child')"], check=True)
"""


def test_the_same_not_recorded_note_from_several_processes_is_shown_once_with_a_count(
    tmp_path: Path,
) -> None:
    (tmp_path / "kids.py").write_text(KIDS)
    done = run_memdoc("run", "-q", "-o", "t.memdoc", "kids.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    text = run_memdoc("diagnose", "t.memdoc", cwd=tmp_path, env={"COLUMNS": "300"})
    notes = [
        line.strip("│ ")
        for line in text.stdout.decode().splitlines()
        if "not recorded: jax" in line
    ]
    assert notes == ["not recorded: jax: the program did not import jax (in 4 processes)"]


def test_record_allocations_on_a_run_without_cuda_says_it_applies_to_cuda_only(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(HELLO)
    done = run_memdoc("run", "--record-allocations", "-o", "t.memdoc", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    said = [line for line in done.stderr.decode().splitlines() if "--record-allocations" in line]
    assert len(said) == 1
    assert "CUDA only" in said[0] and "nothing was recorded" in said[0]


def test_the_diagnosis_piped_to_a_file_has_no_lines_padded_with_spaces(tmp_path: Path) -> None:
    (tmp_path / "oom.py").write_text("raise MemoryError('out of host memory')\n")
    run_memdoc("run", "-q", "-o", "t.memdoc", "oom.py", cwd=tmp_path)
    done = run_memdoc("diagnose", "t.memdoc", cwd=tmp_path)
    assert done.returncode == 3, done.stderr.decode()  # a memory problem found
    lines = done.stdout.decode().splitlines()
    assert any("host" in line for line in lines)
    assert [line for line in lines if line.endswith(" ")] == []


def test_the_host_oom_fix_names_the_cgroup_file_of_this_machines_cgroup_version(
    tmp_path: Path,
) -> None:
    # A unified (v2) hierarchy has cgroup.controllers at its root; v1 has a folder per
    # controller instead.
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    (tmp_path / "oom.py").write_text("raise MemoryError('out of host memory')\n")
    run_memdoc("run", "-q", "-o", "t.memdoc", "oom.py", cwd=tmp_path)
    done = run_memdoc("diagnose", "t.memdoc", cwd=tmp_path, env={"COLUMNS": "200"})
    text = done.stdout.decode()
    if v2:
        assert "/sys/fs/cgroup/memory.max" in text and "limit_in_bytes" not in text
    else:
        assert "/sys/fs/cgroup/memory/memory.limit_in_bytes" in text
        assert "memory.max" not in text


def test_live_without_a_terminal_is_refused_before_the_program_starts(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(HELLO)
    done = run_memdoc("run", "--live", "-o", "t.memdoc", "train.py", cwd=tmp_path, timeout=60)
    stderr = done.stderr.decode()
    assert done.returncode == 2
    assert "the dashboard needs a terminal" in stderr and "Traceback" not in stderr
    assert b"hello from the program" not in done.stdout
    assert not (tmp_path / "t.memdoc").exists()


@pytest.mark.parametrize(
    ("module", "says"),
    [
        pytest.param("no_such_module", "no module named no_such_module", id="missing"),
        pytest.param("pkg.no_such", "no module named pkg.no_such", id="missing-submodule"),
        pytest.param("pkg", "pkg is a package without __main__", id="package-without-main"),
        pytest.param("pkg.plain.deeper", "no module named pkg.plain.deeper", id="not-a-package"),
    ],
)
def test_a_module_that_python_cannot_run_is_refused_and_leaves_no_trace(
    tmp_path: Path, module: str, says: str
) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("open('imported', 'w').close()\n")
    (tmp_path / "pkg" / "plain.py").write_text(HELLO)
    before = sorted(tmp_path.rglob("*"))

    done = run_memdoc("run", "-m", module, cwd=tmp_path, timeout=60)

    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert stderr.startswith(f"memdoc: error: {says}"), stderr
    assert "Traceback" not in stderr
    assert sorted(tmp_path.rglob("*")) == before  # no trace, and pkg was never imported


def test_a_module_found_in_the_current_folder_runs(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text(HELLO)
    (tmp_path / "tool.py").write_text(HELLO)

    for module in ("pkg", "tool", "json.tool"):
        args = ("--help",) if module == "json.tool" else ()
        done = run_memdoc(
            "run", "-q", "--force", "-o", "t.memdoc", "-m", module, *args, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout, module


def test_an_output_folder_that_is_a_file_is_one_line_as_for_headroom_keep(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("print('ran')\n")
    (tmp_path / "runs").write_text("a file, not a folder")

    done = run_memdoc("run", "-q", "-o", "runs/", "train.py", cwd=tmp_path)

    err = done.stderr.decode()
    assert done.returncode == 2
    assert err.strip() == "memdoc: error: cannot write in runs: it is a file, not a folder"
    assert b"ran" not in done.stdout  # nothing runs when its output has nowhere to go
