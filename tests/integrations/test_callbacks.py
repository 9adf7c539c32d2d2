"""Lightning and Keras callbacks on the real libraries: steps, phases, and the OOM ending a fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memdoc.trace import load_run
from memdoc.trace.model import EventKind

PROGRAMS = Path(__file__).resolve().parent / "programs"


def _fit(program: str, tmp_path: Path, mode: str, env: dict[str, str] | None = None) -> Any:
    trace, result = tmp_path / "fit.memdoc", tmp_path / "result.json"
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / program), str(trace), mode, str(result)],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(result.read_text()), load_run([trace]).primary, done.stderr.decode()


def _user_steps(trace: Any) -> list[Any]:
    # The optimizer hook may report steps too; the callback's own are the program's.
    return [e for e in trace.steps() if e.data.get("source") == "user"]


def _labels(trace: Any) -> list[str]:
    return [str(e.data["label"]) for e in trace.marks()]


@pytest.mark.slow
def test_lightning_fit_records_each_optimizer_step_and_each_phase(tmp_path: Path) -> None:
    outcome, trace, _ = _fit("lightning_fit.py", tmp_path, "fit")

    assert outcome["global_step"] == 6
    assert len(_user_steps(trace)) == outcome["global_step"]
    # Lightning's sanity check validates first, then each epoch validates at its end.
    assert _labels(trace) == [
        "eval",
        "train",
        "epoch 0",
        "eval",
        "train",
        "epoch 1",
        "eval",
        "train",
    ]
    assert outcome["diagnosis"] is None


@pytest.mark.slow
def test_lightning_counts_an_accumulated_step_once(tmp_path: Path) -> None:
    outcome, trace, _ = _fit("lightning_fit.py", tmp_path, "accumulate")

    assert outcome["global_step"] == 2  # 3 batches an epoch, one optimizer step
    assert [e.data["global_step"] for e in _user_steps(trace)] == [1, 2]


@pytest.mark.slow
def test_lightning_oom_ending_the_fit_is_recorded_and_diagnosed_once(tmp_path: Path) -> None:
    outcome, trace, stderr = _fit("lightning_fit.py", tmp_path, "oom")

    assert "DefaultCPUAllocator: can't allocate memory" in outcome["error"]
    assert len(trace.events(EventKind.OOM)) == 1
    assert "out of host memory" in outcome["diagnosis"]
    # Lightning runs training_step inside optimizer.step: that is not the optimizer's state.
    assert "Optimizer states" not in outcome["diagnosis"]
    assert stderr.count("out of host memory") == 1
    assert len(_user_steps(trace)) == outcome["global_step"] == 2


@pytest.mark.slow
@pytest.mark.tensorflow
def test_keras_fit_records_each_batch_as_a_step(tmp_path: Path) -> None:
    outcome, trace, _ = _fit("keras_fit.py", tmp_path, "fit")

    assert len(trace.steps()) == outcome["batches"] == 8
    assert _labels(trace) == ["epoch 0", "eval", "train", "epoch 1", "eval", "train"]
    assert outcome["diagnosis"] is None


@pytest.mark.slow
@pytest.mark.tensorflow
def test_keras_resource_exhausted_ending_the_fit_is_recorded_and_diagnosed(tmp_path: Path) -> None:
    cap = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "64"}
    outcome, trace, stderr = _fit("keras_fit.py", tmp_path, "oom", env=cap)

    assert outcome["error"].startswith("ResourceExhaustedError")
    assert len(trace.events(EventKind.OOM)) == 1
    assert "[20000000, 2]" in outcome["diagnosis"]
    assert stderr.count("[20000000, 2] (float) needed") == 1
