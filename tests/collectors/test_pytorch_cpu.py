"""PyTorch on a CPU-only machine, in real programs under `memdoc.watch`: steps come from the
optimizer, CUDA is never touched, OOMs are recorded only when they leave the block."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.trace.model import EventKind
from tests.collectors.framework_helpers import WatchedRun, events_of, last_status, run_program

TRAINING = """
    import json, sys
    import torch
    import memdoc

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters())
    with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
        for _ in range(5):
            loss = model(torch.randn(32, 64)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    # Private, but the one way to see that memdoc took its global hook away again.
    hooks_left = len(sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks)
    print("RESULT " + json.dumps({
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "cuda_initialised": torch.cuda.is_initialized(),
        "hooks_left": hooks_left,
        "imported": [m for m in ("tensorflow", "jax") if m in sys.modules],
    }))
"""


# One worker runs the module: its shared run is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("torch-cpu-run")


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> WatchedRun:
    return run_program(tmp_path_factory.mktemp("training"), TRAINING)


def test_a_cpu_training_loop_gives_one_step_per_optimizer_step_and_never_touches_cuda(
    training: WatchedRun,
) -> None:
    run = training
    trace = run.trace()

    steps = trace.steps()
    assert [(s.data["step"], s.data["source"]) for s in steps] == [
        (i, "optimizer") for i in range(1, 6)
    ]
    assert run.result["cuda_initialised"] is False
    cuda = last_status(trace, "pytorch.cuda")
    assert not cuda.available
    assert "no CUDA" in (cuda.reason or "")
    assert last_status(trace, "pytorch").available
    assert not [k for k in trace.series_keys() if k.metric.startswith("torch.")]
    assert events_of(trace, EventKind.ALLOCATOR_CONFIG, framework="pytorch") == []
    assert run.result["hooks_left"] == 0
    assert run.result["imported"] == []


def test_the_first_optimizer_step_records_parameter_gradient_and_adam_state_bytes(
    training: WatchedRun,
) -> None:
    run = training

    (state,) = events_of(run.trace(), EventKind.MODEL_STATE)
    param_bytes = run.result["param_bytes"]
    assert param_bytes == (64 * 128 + 128 + 128 * 10 + 10) * 4
    assert state.data["phase"] == "first_step"
    assert state.data["device"] == -1
    assert state.data["param_bytes"] == param_bytes
    assert state.data["grad_bytes"] == param_bytes
    # Adam keeps two moments per parameter, plus a one-element step counter per tensor.
    assert state.data["optimizer_state_bytes"] == 2 * param_bytes + 4 * 4
    assert state.data["dtype_bytes"] == {"float32": param_bytes}


OOMS = """
    import json
    import memdoc

    MESSAGE = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.58 GiB"
        " of which 71.25 MiB is free. Including non-PyTorch memory, this process has 13.94 GiB"
        " memory in use. Of the allocated memory 13.64 GiB is allocated by PyTorch, and 67.23 MiB"
        " is reserved by PyTorch but unallocated."
    )
    with memdoc.watch("caught.memdoc", interval=0.05, quiet=True):
        import torch  # inside the block: memdoc switches on when the program imports it
        try:
            raise torch.OutOfMemoryError(MESSAGE)
        except torch.OutOfMemoryError:
            pass
    try:
        with memdoc.watch("uncaught.memdoc", interval=0.05, quiet=True):
            raise torch.OutOfMemoryError(MESSAGE)
    except torch.OutOfMemoryError as exc:
        left = type(exc).__name__
    print("RESULT " + json.dumps({"left": left, "cuda": torch.cuda.is_initialized()}))
"""


def test_an_out_of_memory_error_is_recorded_when_it_leaves_the_block_and_not_when_caught(
    tmp_path: Path,
) -> None:
    run = run_program(tmp_path, OOMS)

    caught = run.trace("caught.memdoc")
    assert events_of(caught, EventKind.OOM) == []
    assert events_of(caught, EventKind.EXCEPTION) == []
    assert "pytorch" in caught.frameworks()

    uncaught = run.trace("uncaught.memdoc")
    (oom,) = events_of(uncaught, EventKind.OOM)
    assert oom.data["oom"]["framework"] == "pytorch"
    assert oom.data["oom"]["requested_bytes"] == 2 * 1024**3
    (exception,) = events_of(uncaught, EventKind.EXCEPTION)
    assert exception.data["where"] == "watch"
    assert exception.data["type"] == "torch.OutOfMemoryError"
    assert run.result == {"left": "OutOfMemoryError", "cuda": False}


NO_FRAMEWORK = """
    import json, sys
    import memdoc

    with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
        blocks = [bytearray(1 << 20) for _ in range(8)]
        memdoc.step()
    frameworks = ("torch", "tensorflow", "jax", "jaxlib", "keras")
    print("RESULT " + json.dumps({"imported": [m for m in frameworks if m in sys.modules]}))
"""


def test_a_program_that_imports_no_framework_gets_none_imported_by_memdoc(tmp_path: Path) -> None:
    run = run_program(tmp_path, NO_FRAMEWORK)
    trace = run.trace()

    assert run.result["imported"] == []
    assert trace.frameworks() == []
    for name, module in (("pytorch", "torch"), ("tensorflow", "tensorflow"), ("jax", "jax")):
        status = last_status(trace, name)
        assert not status.available
        assert status.reason == f"the program did not import {module}"


RETAINING = """
    import json
    import torch
    import memdoc

    real = torch.autograd.backward
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
        model(x).sum().backward()                        # frees its graph
        out = model(x)
        out.sum().backward(retain_graph=True)            # keeps it: line 12
        out.square().sum().backward(retain_graph=True)   # keeps it again
        out.mean().backward()                            # frees it
        out = model(x)
        out.sum().backward(retain_graph=True)
        out.mean().backward()
    print("RESULT " + json.dumps({"restored": torch.autograd.backward is real}))
"""


def test_the_first_backward_that_keeps_its_graph_and_the_first_that_frees_one_after_it(
    tmp_path: Path,
) -> None:
    run = run_program(tmp_path, RETAINING)

    events = [dict(e.data) for e in events_of(run.trace(), EventKind.AUTOGRAD)]
    # The first backward freed a graph before any was kept: nothing to say then.
    assert events == [
        {"retained_at": "program.py:12"},
        {"freed_after_retaining": True},
    ], events
    assert run.result["restored"] is True
