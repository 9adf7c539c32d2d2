"""A folder of traces (`memdoc run -o DIR/`) read by `diagnose` and `report`: a trace that
cannot be read, or one of another run, is left out and named in one line; the rest is read
as one run."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

from memdoc.trace import Event, EventKind, ExitInfo, load_trace
from memdoc.trace.model import Header
from memdoc.trace.runs import other_run
from memdoc.trace.writer import TraceWriter
from tests.conftest import run_memdoc
from tests.report.traces import T0, header, oom_1g, write_rank_traces

FAILING_RANK = 2
THREE_DAYS_S = 72 * 3600.0


def _rank_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "exp42"
    folder.mkdir()
    write_rank_traces(folder, failing_rank=FAILING_RANK)
    return folder


def _damage(folder: Path) -> list[str]:
    """An empty trace, one of random bytes, and a gzip cut before its first line ends."""
    (folder / "empty.memdoc").write_bytes(b"")
    (folder / "noise.memdoc").write_bytes(os.urandom(4096))
    whole = gzip.compress(b'{"type":"header","format":"memdoc-trace","version":1' * 100)
    (folder / "cut.memdoc.gz").write_bytes(whole[:40])
    return ["cut.memdoc.gz", "empty.memdoc", "noise.memdoc"]


def _failed_old_run(path: Path, command: tuple[str, ...], t0: float) -> Path:
    """A trace of another run, days older, that failed at once with an OOM."""
    writer = TraceWriter(path, header(command, t0=t0))
    writer.event(Event(t0 + 1.0, EventKind.OOM, 4242, {"oom": oom_1g().to_dict()}))
    writer.close(ExitInfo(t0 + 1.1, exit_code=1))
    return path


def _lines_naming(stderr: str, name: str) -> list[str]:
    return [line for line in stderr.splitlines() if name in line]


def test_diagnose_reads_a_folder_around_its_damaged_traces_and_names_each(
    tmp_path: Path,
) -> None:
    folder = _rank_folder(tmp_path)
    damaged = _damage(folder)

    done = run_memdoc("diagnose", "--json", str(folder))

    err = done.stderr.decode()
    assert done.returncode == 3, err  # the OOM of the readable traces
    out = json.loads(done.stdout)
    assert out["oom"]["device"] == FAILING_RANK
    assert [r["rank"] for r in out["run"]["ranks"]] == [0, 1, 2, 3]
    for name in damaged:
        (line,) = _lines_naming(err, name)
        assert line.startswith("memdoc: warning: ")
        assert line.endswith("left out, the other traces are read")
    assert "Traceback" not in err


def test_report_reads_a_folder_around_its_damaged_traces(tmp_path: Path) -> None:
    folder = _rank_folder(tmp_path)
    damaged = _damage(folder)

    done = run_memdoc("report", str(folder))

    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert (folder / "report.html").stat().st_size > 0
    assert all(len(_lines_naming(err, name)) == 1 for name in damaged)


def test_a_folder_of_only_damaged_traces_is_one_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    _damage(folder)

    done = run_memdoc("diagnose", str(folder))

    err = done.stderr.decode()
    assert done.returncode == 2
    assert f"memdoc: error: {folder}: no trace in this folder can be read" in err
    assert "Traceback" not in err


def test_a_days_older_trace_of_another_command_is_left_out_with_a_line(tmp_path: Path) -> None:
    folder = _rank_folder(tmp_path)
    old = _failed_old_run(folder / "old.memdoc", ("other.py",), T0 - THREE_DAYS_S)

    done = run_memdoc("diagnose", "--json", str(folder))

    err = done.stderr.decode()
    assert done.returncode == 3, err
    out = json.loads(done.stdout)
    # The rank that failed first in this run, not the other run's failure days before.
    assert out["oom"]["device"] == FAILING_RANK
    assert [r["rank"] for r in out["run"]["ranks"]] == [0, 1, 2, 3]
    (line,) = _lines_naming(err, old.name)
    assert line == (
        f"memdoc: warning: {old}: left out, a trace of another run (another command: other.py)"
    )


def test_a_days_older_trace_of_the_same_command_is_left_out_with_a_line(
    tmp_path: Path,
) -> None:
    folder = _rank_folder(tmp_path)
    old = _failed_old_run(folder / "old.memdoc", ("train.py",), T0 - THREE_DAYS_S)

    done = run_memdoc("diagnose", str(folder))

    err = done.stderr.decode()
    assert done.returncode == 3, err
    assert "72 h before any other rank" not in done.stdout.decode()
    (line,) = _lines_naming(err, old.name)
    assert line.endswith("(started 72h00m before this run)")


def test_the_nodes_of_one_job_differ_in_their_node_rank_and_stay_one_run() -> None:
    def node(rank: int, t0: float) -> Header:
        return header(("torchrun", "--nnodes", "2", "--node-rank", str(rank), "train.py"), t0=t0)

    assert other_run(node(0, T0), node(1, T0 + 30)) is None
    assert other_run(node(0, T0), node(1, T0 + THREE_DAYS_S)) is not None


def test_traces_of_two_jobs_are_two_runs_even_with_one_command() -> None:
    def job(run_id: str | None) -> Header:
        h = header(("train.py",))
        return Header(**{**h.__dict__, "run_id": run_id})

    assert other_run(job("1001.0"), job("1001.0")) is None
    assert other_run(job("1001.0"), job("1002.0")) == "job 1002.0, not 1001.0"
    assert other_run(job("1001.0"), job(None)) is None  # an older trace: the command decides


def test_memdoc_run_records_the_job_it_belongs_to(tmp_path: Path) -> None:
    program = tmp_path / "train.py"
    program.write_text("print('trained')\n")
    jobs = {"job.memdoc": {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "2"}, "none.memdoc": {}}
    for name, env in jobs.items():
        clean = {k: "" for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "MEMDOC_JOB_ID")}
        clean.update({"TORCHELASTIC_RUN_ID": "", "POD_NAME": "", "KUBERNETES_SERVICE_HOST": ""})
        done = run_memdoc(
            "run", "-q", "-o", str(tmp_path / name), "--", sys.executable, str(program),
            env={**clean, **env},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()

    assert load_trace(tmp_path / "job.memdoc").header.run_id == "4711.2"
    assert load_trace(tmp_path / "none.memdoc").header.run_id is None
    first_line = (tmp_path / "none.memdoc").read_text().splitlines()[0]
    assert "run_id" not in first_line  # a header as it always was
