"""The Hugging Face callback on a tiny random BERT: a real Trainer, and the CallbackHandler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.trace import load_run
from memdoc.trace.model import EventKind

PROGRAMS = Path(__file__).resolve().parent / "programs"
PROGRAM = PROGRAMS / "transformers_loop.py"


def _train(
    tmp_path: Path, mode: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), str(tmp_path / "t.memdoc"), mode, str(tmp_path / "r.json")],
        cwd=tmp_path,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_trainer_callback_records_steps_epochs_and_evaluation(tmp_path: Path) -> None:
    done = _train(tmp_path, "fit")

    assert done.returncode == 0, done.stderr[-3000:]
    trace = load_run([tmp_path / "t.memdoc"]).primary
    steps = [e for e in trace.steps() if e.data.get("source") == "user"]
    assert [e.data["global_step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    labels = [e.data["label"] for e in trace.marks()]
    assert labels == ["epoch 0", "eval", "train", "epoch 1", "eval", "train"]


@pytest.mark.slow
def test_callback_summary_holds_what_memdoc_said_at_the_end_of_the_fit(tmp_path: Path) -> None:
    done = _train(tmp_path, "fit")

    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads((tmp_path / "r.json").read_text())
    assert outcome["summary"].startswith("memdoc: ") and "t.memdoc" in outcome["summary"]
    assert outcome["summary"] in done.stderr


@pytest.mark.slow
def test_an_oom_the_program_catches_leaves_no_recording_announced_after_it_ended(
    tmp_path: Path,
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("XDG_RUNTIME_DIR", None)

    done = _train(tmp_path, "caught", env)

    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["global_step"] == 2
    assert list(temp.rglob("*.json")) == []
    assert load_run([tmp_path / "t.memdoc"]).primary.complete  # closed at exit


@pytest.mark.slow
def test_uncaught_oom_in_training_is_recorded_after_the_traceback(tmp_path: Path) -> None:
    done = _train(tmp_path, "oom")

    assert done.returncode == 1
    assert "DefaultCPUAllocator: can't allocate memory" in done.stderr
    assert done.stderr.index("Traceback") < done.stderr.index("out of host memory")
    assert done.stderr.count("out of host memory") == 1
    trace = load_run([tmp_path / "t.memdoc"]).primary
    assert len(trace.events(EventKind.OOM)) == 1


@pytest.mark.slow
def test_real_trainer_records_one_step_per_global_step_and_each_evaluation(
    tmp_path: Path,
) -> None:
    program = PROGRAMS / "transformers_trainer.py"
    done = subprocess.run(
        [sys.executable, str(program), str(tmp_path / "t.memdoc"), str(tmp_path / "out"), "r.json"],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads((tmp_path / "r.json").read_text())
    assert outcome["global_step"] == 6
    assert outcome["diagnosis"] is None
    trace = load_run([tmp_path / "t.memdoc"]).primary
    steps = [e for e in trace.steps() if e.data.get("source") == "user"]
    assert [e.data["global_step"] for e in steps] == list(range(1, outcome["global_step"] + 1))
    marks = trace.marks()
    # 4 examples in batches of 2: two steps an epoch, evaluation after steps 3 and 6.
    assert [e.data["label"] for e in marks] == [
        "epoch 0",
        "epoch 1",
        "eval",
        "train",
        "epoch 2",
        "eval",
        "train",
    ]
    evals = [e.t for e in marks if e.data["label"] == "eval"]
    assert steps[2].t <= evals[0] <= steps[3].t
    assert steps[5].t <= evals[1]
