"""OOMs are recorded in the process that raised them, caught or not, with that process's rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memdoc.trace import load_trace
from memdoc.units import format_bytes
from tests.conftest import run_memdoc
from tests.forecast.runs import STEADY_MALLOC_ENV

MiB = 1024**2

# Two ranks on CPU (gloo); rank 1 caps its own address space 300 MiB above what it maps now,
# writes the cap down, and asks for 1 GiB: a real failed host allocation in that rank only.
SPAWN_RANK_OOM = textwrap.dedent(
    """
    import os, resource, socket, time
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def work(rank, port):
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
        )
        if rank == 1:
            with open("/proc/self/statm") as statm:
                mapped = int(statm.read().split()[0]) * resource.getpagesize()
            cap = mapped + 300 * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            with open("cap.txt", "w") as f:
                f.write(f"{os.getpid()} {cap}")
            torch.ones(256 * 1024 * 1024)
        time.sleep(5)

    if __name__ == "__main__":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(work, args=(port,), nprocs=2)
    """
)


def _needs(module: str) -> None:
    pytest.importorskip(module)


def test_a_spawned_rank_records_its_own_oom_with_its_rank_and_its_own_numbers(
    tmp_path: Path,
) -> None:
    _needs("torch")
    (tmp_path / "ranks.py").write_text(SPAWN_RANK_OOM)

    run = run_memdoc("run", "-o", "t.memdoc", "ranks.py", cwd=tmp_path, timeout=180)

    assert run.returncode == 1, run.stderr[-3000:]
    rank_pid, cap = (int(v) for v in (tmp_path / "cap.txt").read_text().split())
    trace = load_trace(tmp_path / "t.memdoc")
    # THEN the one OOM is the rank's own, recorded in the rank, not relayed by the parent
    (event,) = trace.oom_events()
    assert event.pid == rank_pid
    assert "relayed_by" not in event.data
    assert event.data["host"]["rlimit_as_bytes"] == cap
    ranks = {p.pid: p.rank for p in trace.processes()}
    assert ranks[rank_pid] == 1
    # AND the diagnosis quotes that rank's cap, and says which rank ran out
    out = run_memdoc("diagnose", "--json", "t.memdoc", cwd=tmp_path)
    evidence = {
        e["text"].rpartition(": ")[0]: e["value"]
        for f in json.loads(out.stdout)["findings"]
        for e in f["evidence"]
    }
    assert evidence[f"address-space cap (RLIMIT_AS) of process {rank_pid}"] == cap
    said = f"memdoc: Rank 1 ran out of host memory under its {format_bytes(cap)} address-space cap"
    assert said.encode() in run.stderr
    # AND host-oom weighs the rank's address space against that cap, not the job against RAM
    (host,) = [f for f in json.loads(out.stdout)["findings"] if f["rule"] == "host-oom"]
    texts = [e["text"].rpartition(": ")[0] for e in host["evidence"]]
    assert "address space of the failing process / its limit" in texts, texts
    assert "peak / limit" not in texts and "host RAM" not in texts, texts


# A batch-size finder: each batch that does not fit under the address-space cap is logged
# (to stderr, as `logging` does) and halved, until one fits; the program exits 0.
RETRY_SMALLER = textwrap.dedent(
    """
    import logging, resource
    import torch
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    cap = mapped + 600 * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    batch = 1 << 30
    while True:
        try:
            x = torch.ones(batch // 4)
            break
        except RuntimeError as exc:
            logging.warning("batch of %d bytes did not fit: %s", batch, exc)
            batch //= 4
    print("fitted", batch)
    """
)


def test_an_oom_the_program_catches_and_survives_is_recorded_and_not_called_a_failure(
    tmp_path: Path,
) -> None:
    _needs("torch")
    (tmp_path / "finder.py").write_text(RETRY_SMALLER)

    run = run_memdoc("run", "-o", "t.memdoc", "finder.py", cwd=tmp_path, timeout=180)

    assert run.returncode == 0, run.stderr[-3000:]
    assert b"fitted 268435456" in run.stdout
    trace = load_trace(tmp_path / "t.memdoc")
    (event,) = trace.oom_events()
    assert event.data["oom"]["requested_bytes"] == 1 << 30
    # The program's own process: seen where it was caught (Python 3.12+), else the one
    # Python process of the run printed it.
    assert event.pid == trace.processes(ours=True)[0].pid
    if sys.version_info >= (3, 12):
        assert event.data["handled"] is True
    assert b"memdoc: 1 OOM caught and survived; the run exited 0" in run.stderr
    assert b"Ran out of host memory" not in run.stderr
    diagnosed = run_memdoc("diagnose", "t.memdoc", cwd=tmp_path)
    assert b"1 OOM caught and survived; the run exited 0" in diagnosed.stdout
    assert b"Ran out of" not in diagnosed.stdout


@pytest.mark.parametrize(
    "handler",
    [
        pytest.param("", id="logs-and-exits"),
        # A garbage collection while the handler holds the error (any allocation may start
        # one): the error is not yet caught and survived, the exit decides.
        pytest.param("gc.collect()", id="collects-logs-and-exits"),
    ],
)
def test_a_memory_error_the_program_exits_on_is_recorded_in_its_process(
    tmp_path: Path, handler: str
) -> None:
    # GIVEN a program that catches a real MemoryError under its own cap, logs it, exits 3
    (tmp_path / "loader.py").write_text(
        textwrap.dedent(
            f"""
            import gc, resource, sys
            cap = 600 * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            try:
                blocks = [bytearray(16 * 1024 * 1024) for _ in range(100)]
            except MemoryError:
                blocks = None
                {handler}
                print("could not load the dataset", file=sys.stderr)
                sys.exit(3)
            """
        )
    )

    run = run_memdoc("run", "-o", "t.memdoc", "loader.py", cwd=tmp_path)

    # THEN the status is the program's, and the OOM is its own, with its cap
    assert run.returncode == 3
    trace = load_trace(tmp_path / "t.memdoc")
    (event,) = trace.oom_events()
    assert event.pid == trace.processes(ours=True)[0].pid
    assert event.data["where"] == "exit"
    assert event.data["host"]["rlimit_as_bytes"] == 600 * MiB
    assert b"memdoc: Ran out of host memory under its 600.0 MiB address-space cap" in run.stderr


# TensorFlow's CPU BFC allocator capped at 64 MiB: a 128 MiB tensor raises a real
# ResourceExhaustedError (and TensorFlow prints its allocator dump); the program falls back
# to a smaller tensor and exits 0.
TF_FALLBACK = textwrap.dedent(
    """
    import tensorflow as tf
    try:
        big = tf.ones((32 * 1024 * 1024,), dtype=tf.float32)
        print("fitted", float(tf.reduce_sum(big)))
    except tf.errors.ResourceExhaustedError:
        small = tf.ones((1024,), dtype=tf.float32)
        print("fell back", float(tf.reduce_sum(small)))
    """
)


def test_a_tensorflow_oom_the_program_survives_is_counted_once_and_not_a_failure(
    tmp_path: Path,
) -> None:
    _needs("tensorflow")
    (tmp_path / "fallback.py").write_text(TF_FALLBACK)
    env = {
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
        "TF_CPU_BFC_MEM_LIMIT_IN_MB": "64",
        "TF_CPP_MIN_LOG_LEVEL": "0",
    }

    run = run_memdoc("run", "-o", "t.memdoc", "fallback.py", cwd=tmp_path, env=env, timeout=240)

    assert run.returncode == 0, run.stderr[-3000:]
    assert b"fell back 1024.0" in run.stdout
    trace = load_trace(tmp_path / "t.memdoc")
    ooms = trace.oom_events()
    assert ooms and all(e.data["oom"]["framework"] == "tensorflow" for e in ooms)
    assert b"memdoc: 1 OOM caught and survived; the run exited 0" in run.stderr
    assert b"Ran out of" not in run.stderr


# A hand-written retry loop that halves its batch on an OOM and calls nothing else: no
# `gc.collect()`, no finder of a library. Its blocks are checkpointed, so the batch of 2048
# fits through the forward pass and runs out in the backward pass, where the activations
# are made again; smaller batches run out (1024, in the forward pass) until one trains.
HALVING_LOOP = textwrap.dedent(
    """
    import resource
    import torch
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    torch.backends.mkldnn.enabled = False  # the plain kernels raise the allocator's error
    block = torch.nn.Sequential(
        torch.nn.Linear(256, 8192), torch.nn.ReLU(inplace=True), torch.nn.Linear(8192, 256)
    )
    optimizer = torch.optim.SGD(block.parameters(), lr=0.01)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (100 << 20), resource.RLIM_INFINITY))
    batch = 2048
    while True:
        try:
            for _ in range(3):
                loss = checkpoint(block, torch.randn(batch, 256), use_reentrant=False)
                loss.square().mean().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            break
        except RuntimeError:
            batch //= 2
    print("trained at", batch)
    """
)


def _trained_alone(tmp_path: Path, program: str) -> int:
    """Write the halving loop `program` to halving.py and run it without memdoc: the batch
    size it trained at. glibc's mmap threshold fixed, so that the sizes that fit do not move
    with how the heap took the freed 64 MiB tensors of the first tries."""
    (tmp_path / "halving.py").write_text(program)
    plain = subprocess.run(
        [sys.executable, "halving.py"],
        cwd=tmp_path,
        env={**os.environ, **STEADY_MALLOC_ENV},
        capture_output=True,
        timeout=180,
        check=True,
    )
    return int(plain.stdout.split(b"trained at")[1])


def _every_failure_caught(trace_path: Path, trained: int, program: str = "halving.py") -> None:
    """Each size above the one that trained ran out once, and each error is recorded as
    caught in the program's own code."""
    failures = (2048 // trained).bit_length() - 1
    assert failures >= 2  # the backward pass's at 2048, and a forward pass's at least
    ooms = load_trace(trace_path).oom_events()
    assert len(ooms) == failures, [e.data["oom"]["requested_bytes"] for e in ooms]
    assert all(e.data["where"] == "caught" and e.data["handled"] for e in ooms)
    assert all(any(program in f for f in e.data["stack"]) for e in ooms)


def test_a_retry_loop_that_halves_its_batch_has_its_caught_backward_oom_recorded(
    tmp_path: Path,
) -> None:
    _needs("torch")
    alone = _trained_alone(tmp_path, HALVING_LOOP)
    run = run_memdoc(
        "run",
        "-q",
        "-o",
        "t.memdoc",
        "halving.py",
        cwd=tmp_path,
        timeout=180,
        env=STEADY_MALLOC_ENV,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    trained = int(run.stdout.split(b"trained at")[1])
    # memdoc leaves the program the memory it would have had: the same size trains (reading
    # a running frame's locals once kept each failed try's tensors alive: 64 for 512)
    assert trained == alone
    failures = (2048 // trained).bit_length() - 1
    assert trained <= 1024
    trace = load_trace(tmp_path / "t.memdoc")
    ooms = trace.oom_events()
    assert all(e.data["where"] == "caught" and e.data["handled"] for e in ooms), ooms
    # The backward pass's error, seen as it left `torch.autograd.backward` on any Python:
    # the batch of 2048's activations, made again (2048 x 8192 floats), with the program's
    # line in its stack. Python 3.12+ also sees the smaller batches' errors (in the forward
    # pass, or in the backward pass when the machine is busy).
    in_backward = [e for e in ooms if e.data["oom"]["requested_bytes"] == 64 << 20]
    assert len(in_backward) == 1, [e.data["oom"]["requested_bytes"] for e in ooms]
    assert any("halving.py" in frame for frame in in_backward[0].data["stack"])
    if sys.version_info >= (3, 12):
        assert len(ooms) == failures
    assert 1 <= len(ooms) <= failures
    # Three steps at the size that trained; a larger size may take a step or two before it
    # runs out (how much the heap holds when the next step starts varies with the machine).
    assert 3 <= len(trace.steps()) <= 3 + 2 * failures


def test_a_retry_loop_that_empties_the_cache_has_every_caught_oom_recorded(
    tmp_path: Path,
) -> None:
    _needs("torch")
    # The same loop, its handler written for a GPU: `torch.cuda.empty_cache()` before it
    # halves the batch (a no-op on a CPU). Every error, the forward passes' too, is seen in
    # the handler on any Python (before 3.12, only the backward pass's was, on its way out).
    handler = "except RuntimeError:\n        torch.cuda.empty_cache()\n"
    program = HALVING_LOOP.replace("except RuntimeError:\n", handler)
    assert program != HALVING_LOOP
    alone = _trained_alone(tmp_path, program)

    run = run_memdoc(
        "run", "-q", "-o", "t.memdoc", "halving.py", cwd=tmp_path, timeout=180,
        env=STEADY_MALLOC_ENV,
    )  # fmt: skip

    assert run.returncode == 0, run.stderr[-3000:]
    trained = int(run.stdout.split(b"trained at")[1])
    # memdoc keeps no failed try alive (that cost three halvings once); its own agent
    # takes a little of the room, which on a busy machine can cost one halving.
    assert trained >= alone // 2
    _every_failure_caught(tmp_path / "t.memdoc", trained)


def test_with_forward_errors_a_retry_loop_that_only_halves_has_every_caught_oom_recorded(
    tmp_path: Path,
) -> None:
    _needs("torch")
    # The loop's handler only halves the batch: before Python 3.12 its forward passes'
    # errors leave nothing memdoc sees, unless `--forward-errors` hooks the forward passes.
    alone = _trained_alone(tmp_path, HALVING_LOOP)

    run = run_memdoc(
        "run", "-q", "--forward-errors", "-o", "t.memdoc", "halving.py", cwd=tmp_path,
        timeout=180, env=STEADY_MALLOC_ENV,
    )  # fmt: skip

    assert run.returncode == 0, run.stderr[-3000:]
    trained = int(run.stdout.split(b"trained at")[1])
    # memdoc keeps no failed try alive (that cost three halvings once); its own agent
    # takes a little of the room, which on a busy machine can cost one halving.
    assert trained >= alone // 2
    _every_failure_caught(tmp_path / "t.memdoc", trained)


def test_a_watched_block_records_every_oom_its_handler_catches(tmp_path: Path) -> None:
    _needs("torch")
    # The halving loop inside `memdoc.watch`, its handler collecting before it halves: the
    # block's own session sees the errors in hand (a collection before 3.12, where they are
    # caught from 3.12), and stops looking when the block ends.
    body = textwrap.indent(HALVING_LOOP.split("batch = 2048\n", 1)[1], "    ")
    handler = "except RuntimeError:\n            gc.collect()\n"
    body = body.replace("except RuntimeError:\n", handler)
    program = (
        "import gc\nimport memdoc\n"
        + HALVING_LOOP.split("batch = 2048\n", 1)[0]
        + "callbacks = len(gc.callbacks)\n"
        + 'with memdoc.watch("t.memdoc", quiet=True):\n    batch = 2048\n'
        + body
        + "print('callbacks after', len(gc.callbacks) - callbacks)\n"
    )
    (tmp_path / "watched.py").write_text(program)

    done = subprocess.run(
        [sys.executable, "watched.py"],
        cwd=tmp_path,
        env={**os.environ, **STEADY_MALLOC_ENV},
        capture_output=True,
        timeout=180,
        check=False,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    trained = int(done.stdout.split(b"trained at")[1].split()[0])
    assert b"callbacks after 0" in done.stdout  # nothing of the watch is left behind
    _every_failure_caught(tmp_path / "t.memdoc", trained, "watched.py")
