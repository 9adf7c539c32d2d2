"""Steps, phases and caught OOMs from the frameworks' own loops, with no code change: real
Keras, JAX, Lightning, Hugging Face and accelerate programs run under `memdoc run`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from memdoc.trace.phases import batch_search
from memdoc.trace.reader import Trace, load_trace
from tests.conftest import run_memdoc

PROGRAMS = Path(__file__).resolve().parent / "loop_programs"


def _run(tmp_path: Path, program: str, env: dict[str, str] | None = None) -> Trace:
    trace = tmp_path / "run.memdoc"
    done = run_memdoc(
        "run", "-q", "-o", str(trace), str(PROGRAMS / program), cwd=tmp_path, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return load_trace(trace)


def _phases(trace: Trace) -> list[str]:
    """The phase marks in order, repeats folded."""
    out: list[str] = []
    for mark in trace.marks():
        label = str(mark.data.get("label"))
        if "phase" in mark.data and (not out or out[-1] != label):
            out.append(label)
    return out


def _phase_marks(trace: Trace, label: str) -> list[dict[str, Any]]:
    return [dict(m.data) for m in trace.marks() if m.data.get("label") == label]


def _plans(trace: Trace) -> list[tuple[int, int | None]]:
    """(planned steps, steps of an epoch) of each plan a loop said after its phase began."""
    return [
        (m.data["planned_steps"], m.data.get("epoch_steps"))
        for m in trace.marks()
        if "phase" not in m.data and "planned_steps" in m.data
    ]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_keras_fit_batches_are_steps_and_its_loops_are_phases(tmp_path: Path, backend: str) -> None:
    trace = _run(tmp_path, "keras_fit.py", env={"KERAS_BACKEND": backend})

    steps = trace.steps()
    assert len(steps) == 3 * 8  # 256 training samples in batches of 32, 3 epochs
    assert {s.data["source"] for s in steps} == {"keras"}
    assert _phases(trace) == [
        "train", "eval", "train", "eval", "train", "eval", "train", "phase ended",
        "eval", "phase ended", "predict", "phase ended",
    ]  # fmt: skip
    # Keras never records gradients while it evaluates or predicts.
    assert all(m["grad_enabled"] is False for m in _phase_marks(trace, "eval"))
    assert all(m["source"] == "keras" for m in _phase_marks(trace, "train"))
    # The fit said how many steps it would run (3 epochs of 8 batches), for the forecast.
    assert [m.get("planned_steps") for m in _phase_marks(trace, "train")] == [24, None, None, None]
    assert _phase_marks(trace, "train")[0].get("epoch_steps") == 8
    # What the model holds, from the shapes: 8x16 + 16 and 16x1 + 1 float32 weights, and
    # Adam's two moments (and a few scalars), which `fit` builds before its first step on
    # JAX and torch, and inside it on TensorFlow.
    state = trace.events("model_state")[-1]
    params = (8 * 16 + 16 + 16 + 1) * 4
    assert state.data["param_bytes"] == params
    assert 2 * params <= state.data["optimizer_state_bytes"] <= 2 * params + 64
    if backend == "tensorflow":
        assert state.data["phase"] == "first_step" and state.t <= steps[1].t
    else:
        assert state.data["phase"] == "fit" and state.t <= steps[0].t


@pytest.mark.slow
def test_a_jitted_function_called_again_and_again_is_the_step(tmp_path: Path) -> None:
    trace = _run(tmp_path, "jax_loop.py")

    steps = trace.steps()
    # 20 calls of train_step: the step is known from its second call on; init (called
    # once) and eval_step (named for evaluation) are not steps.
    assert len(steps) == 19
    assert {s.data["source"] for s in steps} == {"jax"}
    assert _phases(trace) == ["train", "eval", "train", "eval"]
    assert all(m["grad_enabled"] is False for m in _phase_marks(trace, "eval"))


@pytest.mark.slow
def test_every_caught_oom_is_recorded_with_the_batch_size_tried(tmp_path: Path) -> None:
    trace = _run(tmp_path, "batch_finders.py")

    ooms = trace.oom_events()
    # accelerate tries 64, 57, ..., 22 (10 failures) and trains at 19; the hand-written
    # loop fails at 64 and 32 and goes on at 16: twelve errors, none merged with another.
    assert len(ooms) == 12
    assert all(e.data["where"] == "caught" and e.data["handled"] for e in ooms)
    search = batch_search(trace)
    assert search is not None and search.finder == "accelerate"
    assert search.tried == (64, 57, 51, 45, 40, 36, 32, 28, 25, 22, 19)
    assert search.ran_out == search.tried[:-1] and search.trained == 19
    assert len(trace.steps()) == 5  # the training at 19
    assert trace.exit is not None and trace.exit.status == 0


def _stdout(tmp_path: Path, program: str) -> tuple[str, Trace]:
    trace = tmp_path / "run.memdoc"
    done = run_memdoc("run", "-q", "-o", str(trace), str(PROGRAMS / program), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return done.stdout.decode(), load_trace(trace)


def test_a_finder_tries_again_with_nothing_of_the_failed_try_alive(tmp_path: Path) -> None:
    # Reading the size tried from the finder's frame while it handled the error kept the
    # error, with the failed try's frames, alive through the next try (1 alive before).
    out, trace = _stdout(tmp_path, "finder_frees.py")
    assert out.strip() == "trained at 40 with 0 failed tries alive"
    assert [e.data["batch_size"] for e in trace.oom_events()] == [64, 57, 51, 45]


@pytest.mark.slow
def test_the_trainers_auto_find_batch_size_trains_as_it_does_alone(tmp_path: Path) -> None:
    # memdoc once bound accelerate's finder over the Trainer's own, which takes other
    # parameters: the Trainer's search died with "'bool' object is not callable".
    out, trace = _stdout(tmp_path, "hf_auto_find.py")
    assert out.strip().splitlines()[-1] == "trained at 19"
    assert [e.data["batch_size"] for e in trace.oom_events()] == [32, 28, 25, 22]
    search = batch_search(trace)
    assert search is not None and search.finder == "accelerate" and search.trained == 19


@pytest.mark.slow
def test_a_caught_jax_oom_is_recorded_and_leaves_nothing_of_the_failed_try_alive(
    tmp_path: Path,
) -> None:
    # Reading the jitted call's arguments from its frame while it handled the error kept the
    # failed try alive past the program's handler ("kept" before, "freed" in a plain run).
    out, trace = _stdout(tmp_path, "jax_caught.py")
    assert out.split() == ["freed", "trained", "at", "8192"]
    [oom] = trace.oom_events()
    assert oom.data["where"] == "caught" and oom.data["jitted_call"] == "train_step"
    assert oom.data["compiled_memory"]["temp"] >= 128 << 20  # the 128 MiB it asked for


@pytest.mark.slow
def test_lightning_loops_are_phases_and_its_finder_records_each_failure(tmp_path: Path) -> None:
    trace = _run(tmp_path, "lightning_fit.py")

    search = batch_search(trace)
    assert search is not None  # power scaling until 32 fails, then back to 16
    assert (search.tried, search.ran_out, search.trained) == ((8, 16, 32, 16), (32,), 16)
    [oom] = trace.oom_events()
    assert oom.data["where"] == "caught" and oom.data.get("batch_size") == 32
    phases = _phases(trace)
    assert phases[0] == "batch-size search"
    assert phases[-6:] == ["train", "eval", "train", "eval", "train", "phase ended"][-6:] or (
        "predict" in phases
    )
    assert ["train", "eval", "train", "eval", "train"] == [
        p for p in phases[phases.index("phase ended") + 1 :] if p in ("train", "eval")
    ]
    assert all(m["grad_enabled"] is False for m in _phase_marks(trace, "eval"))
    # 2 trials of 2 steps, then the fit: 64 samples in batches of 16 for 2 epochs, the new
    # optimizer counted from its second step.
    assert len(trace.steps()) == 4 + 7
    # Each fit said how many steps it would run, for the forecast: the finder's trials
    # (max_steps=2 each) when they began, and the fit (2 epochs of 4 steps) once it had
    # set up its data, with its epochs.
    assert 2 in [m.get("planned_steps") for m in _phase_marks(trace, "train")]
    assert _plans(trace) == [(8, 4)]  # the trials' phase marks said theirs: not again


@pytest.mark.slow
def test_the_hugging_face_trainer_evaluation_is_a_phase(tmp_path: Path) -> None:
    trace = _run(tmp_path, "hf_trainer.py")

    assert len(trace.steps()) == 2 * 32 // 8
    assert _phases(trace) == [
        "train", "eval", "train", "eval", "train", "phase ended",
        "eval", "phase ended", "predict", "phase ended",
    ]  # fmt: skip
    assert all(m["grad_enabled"] is False for m in _phase_marks(trace, "eval"))
    # `max_steps=8` said how many steps `train` would run, for the forecast, and `train`
    # said its 2 epochs of 4 steps once it had counted them from the data.
    assert _phase_marks(trace, "train")[0].get("planned_steps") == 8
    assert _plans(trace) == [(8, 4)]


def test_a_hook_runs_inside_the_import_before_the_next_line(tmp_path: Path) -> None:
    (tmp_path / "late_module.py").write_text("VALUE = 1\n")
    code = textwrap.dedent(
        """
        import importlib.resources, sys
        from memdoc.collectors.loops.imports import when_imported
        seen = []
        when_imported("late_module", lambda m: setattr(m, "VALUE", m.VALUE + 1))
        when_imported("late_module", lambda m: 1 / 0)  # a failing hook is ignored
        from late_module import VALUE
        import late_module
        assert VALUE == 2, VALUE
        assert type(late_module.__loader__).__name__ == "SourceFileLoader"
        assert "exec_module" not in vars(late_module.__loader__)
        when_imported("late_module", lambda m: seen.append(m.__name__))  # already imported
        assert seen == ["late_module"], seen
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.slow
def test_watch_in_code_sees_steps_of_a_function_jitted_before_it_started(
    tmp_path: Path,
) -> None:
    code = textwrap.dedent(
        """
        import memdoc, jax, jax.numpy as jnp
        @jax.jit
        def update(w):
            return w * 0.5
        with memdoc.watch("in-code.memdoc", quiet=True):
            w = jnp.ones(4)
            for _ in range(6):
                w = update(w)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert len(load_trace(tmp_path / "in-code.memdoc").steps()) == 5


@pytest.mark.slow
def test_an_oom_inside_a_jitted_call_carries_xlas_memory_analysis_of_it(tmp_path: Path) -> None:
    program = Path(__file__).resolve().parent.parent / "rules" / "programs" / "jax_donation.py"
    trace_path = tmp_path / "run.memdoc"
    done = run_memdoc(
        "run", "-q", "-o", str(trace_path), str(program), cwd=tmp_path, env={"DONATE": "0"}
    )
    assert done.returncode == 1, done.stderr.decode(errors="replace")[-2000:]

    [oom] = load_trace(trace_path).oom_events()
    assert oom.data["jitted_call"] == "train_step"
    plan = oom.data["compiled_memory"]
    # The step's arguments and outputs are the 64 MiB table and its two moments, three
    # copies each (and a small head); nothing donated, few temporaries.
    assert 192 * 2**20 <= plan["argument"] < 200 * 2**20
    assert 192 * 2**20 <= plan["output"] < 200 * 2**20
    assert plan["alias"] == 0 and plan["temp"] < 2**20
