"""JAX on CPU, for real: live-array accounting per device matches what the program holds,
several host devices are each reported, and a real RESOURCE_EXHAUSTED becomes an OOM event."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.trace.model import EventKind
from tests.collectors.framework_helpers import WatchedRun, events_of, last_status, run_program

MiB = 1024**2
DEVICES = 4

PROGRAM = """
    import json, resource, time
    from pathlib import Path
    import jax, jax.numpy as jnp
    import memdoc
    from memdoc.collectors.frameworks import ArtifactDir
    from memdoc.collectors.jax import JaxCollector, live_array_summary

    result = {}
    try:
        with memdoc.watch("run.memdoc", interval=0.05, quiet=True) as w:
            devices = jax.devices()
            # Device k holds k+1 MiB: one array of (k+1) x 256 x 1024 float32.
            held = [
                jax.device_put(jnp.zeros((k + 1, 256, 1024), jnp.float32), d)
                for k, d in enumerate(devices)
            ]
            jax.block_until_ready(held)
            time.sleep(1.3)  # JAX's CPU accounting runs about once a second
            result["summary"] = live_array_summary()
            # A second JAX collector on the same session, to ask it directly what it would
            # add to an OOM event, and what one live-array scan costs.
            collector = JaxCollector(files=ArtifactDir(Path.cwd()))
            collector.start(w.session)
            collector.sample(time.time())
            result["scan_s"] = collector.last_scan_s
            # A memory cap a little above what the process maps now; then ask for 1 GiB.
            with open("/proc/self/statm") as statm:
                mapped = int(statm.read().split()[0]) * resource.getpagesize()
            cap = mapped + 256 * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            try:
                jnp.ones((256 * 1024 * 1024,), jnp.float32).block_until_ready()
            except Exception as exc:
                result["context"] = collector.oom_context(exc)
                raise
    except Exception as exc:
        result["raised"] = f"{type(exc).__module__}.{type(exc).__name__}"
        result["message"] = str(exc)[:200]
    print("RESULT " + json.dumps(result))
"""


# One worker runs the module: its shared run is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("jax-cpu-run")


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory: pytest.TempPathFactory) -> WatchedRun:
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}"}
    return run_program(tmp_path_factory.mktemp("jax"), PROGRAM, env=env)


def test_each_host_device_reports_the_bytes_of_the_arrays_the_program_holds_on_it(
    jax_run: WatchedRun,
) -> None:
    trace = jax_run.trace()

    for k in range(DEVICES):
        (series,) = trace.series_for("jax.allocated", device=-1 - k)
        held = (k + 1) * MiB
        # JAX keeps the odd scalar of its own alive for a moment (4 bytes, seen on device 0).
        assert held <= max(series.values) < held + 1024, f"device {k}"
    described = next(
        e.data["devices"]
        for e in reversed(trace.events(EventKind.FRAMEWORK))
        if e.data["name"] == "jax"
    )
    assert [d["index"] for d in described] == [-1, -2, -3, -4]
    assert not any(d["memory_stats"] for d in described)


def test_the_live_array_summary_groups_what_is_held_by_shape_and_dtype(
    jax_run: WatchedRun,
) -> None:
    summary = jax_run.result["summary"]

    assert summary["count"] == DEVICES
    assert summary["bytes"] == sum(k + 1 for k in range(DEVICES)) * MiB
    assert summary["by_device"] == {str(-1 - k): (k + 1) * MiB for k in range(DEVICES)}
    assert summary["groups"][0] == {
        "shape": [DEVICES, 256, 1024],
        "dtype": "float32",
        "count": 1,
        "bytes": DEVICES * MiB,
    }
    # A scan of a few arrays costs well under a millisecond.
    assert jax_run.result["scan_s"] < 0.005


def test_a_real_resource_exhausted_under_a_memory_cap_becomes_a_jax_oom_event(
    jax_run: WatchedRun,
) -> None:
    trace = jax_run.trace()

    assert jax_run.result["raised"] == "jax.errors.JaxRuntimeError"
    assert jax_run.result["message"].startswith("RESOURCE_EXHAUSTED")
    (oom,) = events_of(trace, EventKind.OOM)
    assert oom.data["oom"]["framework"] == "jax"
    assert oom.data["oom"]["requested_bytes"] == 1024 * MiB
    assert last_status(trace, "jax").available


def test_at_an_oom_the_collector_adds_live_arrays_and_a_memory_profile_beside_the_trace(
    jax_run: WatchedRun,
) -> None:
    context = jax_run.result["context"]

    assert context["live_arrays"]["bytes"] >= sum(k + 1 for k in range(DEVICES)) * MiB
    profile = jax_run.folder / context["memory_profile"]
    assert profile.read_bytes()[:2] == b"\x1f\x8b"  # a gzipped pprof profile
    snapshots = events_of(jax_run.trace(), EventKind.SNAPSHOT, framework="jax")
    assert context["memory_profile"] in [s.data["path"] for s in snapshots]


def test_the_oom_event_of_the_session_carries_what_the_jax_collector_knew(
    jax_run: WatchedRun,
) -> None:
    trace = jax_run.trace()

    (oom,) = trace.oom_events()
    assert oom.data["oom"]["framework"] == "jax"
    assert oom.data["live_arrays"]["bytes"] >= sum(k + 1 for k in range(DEVICES)) * MiB
    assert (jax_run.folder / oom.data["memory_profile"]).exists()


@pytest.mark.parametrize("runs_jax", [False, True], ids=["imported-only", "backend-started"])
def test_jax_is_named_a_framework_of_the_run_only_once_a_backend_starts(
    tmp_path: Path, runs_jax: bool
) -> None:
    # Another framework may import JAX for its own use (TensorFlow with Keras 3 does): a
    # program that never runs JAX must not get JAX's findings and fixes.
    use = "jax.numpy.ones(4).block_until_ready()" if runs_jax else "pass"
    source = f"""
        import time, jax, jax.numpy
        import memdoc
        with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
            {use}
            time.sleep(0.3)
        print("RESULT {{}}")
    """
    run = run_program(tmp_path, source)

    assert run.process.returncode == 0, run.process.stderr
    assert ("jax" in run.trace().frameworks()) is runs_jax


def test_the_optimizer_state_among_a_jitted_calls_arguments_is_counted_by_its_kind() -> None:
    import collections

    import jax
    import numpy as np
    from jax.example_libraries import optimizers

    from memdoc.collectors.loops.jax import _state_bytes

    leaves = jax.tree_util.tree_leaves
    table = np.zeros((256, 64), np.float32)  # 64 KiB
    # jax.example_libraries: one packed (parameter, *moments) per leaf; parameters left out
    init, _, _ = optimizers.adam(1e-3)
    assert _state_bytes((init({"a": table, "b": table}),), leaves, 0) == 4 * table.nbytes
    # Optax: every array of its states (a stand-in class with Optax's module name)
    adam = collections.namedtuple("ScaleByAdamState", ["count", "mu", "nu"])
    adam.__module__ = "optax._src.transform"
    state = (adam(np.zeros((), np.int32), {"w": table}, {"w": table}), ())
    assert _state_bytes(({"w": table}, state, {"batch": table}), leaves, 0) == 2 * table.nbytes + 4
    # A Flax TrainState-like dataclass: its `opt_state`, not its parameters
    import dataclasses

    @dataclasses.dataclass
    class TrainState:
        params: dict[str, np.ndarray]
        opt_state: tuple[np.ndarray, ...]

    assert _state_bytes((TrainState({"w": table}, (table,)),), leaves, 0) == table.nbytes
    # No optimizer state: parameters and a batch alone
    assert _state_bytes(({"w": table}, table), leaves, 0) == 0
