"""`memdoc headroom` on real programs under a memory cap: the answer really trains, and the
next size up really runs out. Bad input gets one line and a non-zero exit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_memdoc
from tests.forecast.runs import PROGRAMS, STEADY_MALLOC_ENV, memdoc_run

STEPS = "6"  # what the "training" runs: more steps than the probes (4)
RLIMIT_AS = "address-space cap (RLIMIT_AS)"
BFC_LIMIT = "TensorFlow host allocator limit"


def headroom(
    *args: str, timeout: float = 900, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    done = run_memdoc("headroom", *args, timeout=timeout, env=env)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.parametrize(
    ("program", "budget_mib", "sizes", "multiple_of", "within", "limit"),
    [
        # The sizes given are each program's border (found by searches from far below it):
        # the search must see that they bracket it and answer the one that trained, and the
        # runs after check it from outside. The search from far away, growing and bisecting,
        # is tested on a stand-in probe (test_headroom_search.py). A JAX program's border
        # moves from run to run, plainly too (its threads share glibc's arenas as they
        # come: benchmarks/headroom), so it is not pinned here.
        pytest.param("torch_batch.py", "320", "1024,1152", 128, 1, RLIMIT_AS, id="pytorch"),
        # Fixed memory (an embedding, its Adam state) dominates the small sizes.
        pytest.param(
            "torch_attention.py", "500", "160,176", 16, 1, RLIMIT_AS, id="pytorch-attention"
        ),
        pytest.param("tf_batch.py", "300", "640,704", 64, 1, BFC_LIMIT, id="tensorflow"),
    ],
)
def test_the_answer_trains_and_the_next_size_up_runs_out(
    tmp_path: Path,
    program: str,
    budget_mib: str,
    sizes: str,
    multiple_of: int,
    within: int,
    limit: str,
) -> None:
    pytest.importorskip({"tf": "tensorflow"}.get(program.split("_")[0], program.split("_")[0]))
    code, out, err = headroom(
        "--sizes",
        sizes,
        "--steps",
        "4",
        "--margin",
        "0",
        "--multiple-of",
        str(multiple_of),
        "--json",
        "--",
        sys.executable,
        str(PROGRAMS / program),
        "{}",
        budget_mib,
        STEPS,
        env=STEADY_MALLOC_ENV,
    )
    assert code == 0, err
    answer = json.loads(out)
    size = answer["largest_size"]
    assert size is not None and size % multiple_of == 0
    assert answer["limit"] == limit
    # The truth is found as the probes ran: under `memdoc run` (whose agent, on a machine
    # without an accelerator, starts no thread and so takes no arena under the cap).
    fits = memdoc_run(tmp_path, program, str(size), budget_mib, STEPS, env=STEADY_MALLOC_ENV)
    assert fits.returncode == 0 and "done" in fits.stdout, fits.stderr[-1500:]
    too_big = memdoc_run(
        tmp_path,
        program,
        str(size + within * multiple_of),
        budget_mib,
        STEPS,
        env=STEADY_MALLOC_ENV,
    )
    next_up = size + within * multiple_of
    assert too_big.returncode != 0, f"the answer was {size}, and {next_up} trained"
    assert "memory" in too_big.stderr.lower() or "RESOURCE_EXHAUSTED" in too_big.stderr


def test_a_command_without_a_placeholder_gets_one_line() -> None:
    code, _, err = headroom("--", sys.executable, "train.py", "--batch-size", "32")
    assert code == 2
    assert err.splitlines()[0] == "memdoc: error: the command has no {} where the batch size goes"
    assert "Traceback" not in err


def test_a_command_that_does_not_exist_gets_one_line() -> None:
    code, _, err = headroom("--", "no-such-trainer", "{}")
    assert code == 2
    assert err.splitlines()[0] == "memdoc: error: no-such-trainer: command not found"


@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param("8", id="one-size"),
        pytest.param("8,x", id="not-a-number"),
        pytest.param("0,8", id="zero"),
    ],
)
def test_bad_sizes_get_one_line(sizes: str) -> None:
    code, _, err = headroom("--sizes", sizes, "--", sys.executable, "train.py", "{}")
    assert code == 2
    assert err.startswith("memdoc: error: ")
    assert "Traceback" not in err


def test_a_size_that_fails_for_another_reason_gets_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "import memdoc\n"
        "size = int(sys.argv[1])\n"
        "if size > 10:\n"
        "    raise ValueError(f'batch {size} does not divide the dataset')\n"
        "memdoc.step()\n"
    )
    code, _, err = headroom("--sizes", "8,16", "--", sys.executable, str(script), "{}")
    assert code == 2
    first = err.splitlines()[0]
    assert first.startswith("memdoc: error: size 16: the program failed (exit status 1)")
    assert "does not divide the dataset" in first
    assert "Traceback" not in err.splitlines()[0]


def test_the_agent_ends_the_run_cleanly_after_the_steps_asked_for(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    done = memdoc_run(
        tmp_path, "torch_batch.py", "16", "320", "50", env={"MEMDOC_STOP_AFTER_STEPS": "3"}
    )
    assert done.returncode == 0, done.stderr[-1500:]
    # The third optimizer step ends the run, before the program prints it.
    assert "step 2" in done.stdout and "step 3" not in done.stdout
    from memdoc.trace import load_trace
    from memdoc.trace.model import EventKind

    trace = load_trace(tmp_path / "torch_batch.memdoc")
    assert len(trace.steps()) == 3
    (stop,) = trace.events(EventKind.STOP)
    assert stop.data["after_steps"] == 3
    assert stop.data["host"]["address_space_peak_bytes"] > 0
