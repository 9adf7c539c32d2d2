"""TensorFlow's BFC allocator on CPU, for real, in one program that also uses PyTorch and JAX:
values move with real tensors, a real ResourceExhaustedError becomes an OOM event, and each
framework is attributed in the one trace."""

from __future__ import annotations

import pytest

from memdoc.trace.model import EventKind, SeriesKey
from tests.collectors.framework_helpers import WatchedRun, events_of, last_status, run_program

MiB = 1024**2
LIMIT_MB = 256

# TensorFlow takes seconds to import: one program serves every test in this file.
PROGRAM = """
    import json, os, time
    import tensorflow as tf
    import torch
    import jax, jax.numpy as jnp
    import memdoc

    result = {}
    try:
        with memdoc.watch("run.memdoc", interval=0.05, quiet=True):
            tf.constant(1.0)  # the program's first op starts TensorFlow's runtime
            time.sleep(0.3)
            big = tf.ones((16 * 1024 * 1024,), tf.float32)  # 64 MiB
            time.sleep(0.3)
            del big
            time.sleep(0.3)
            model = torch.nn.Linear(8, 8)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(2, 8)).sum().backward()
            optimizer.step()
            held = jnp.ones((256, 1024), jnp.float32)  # 1 MiB on JAX's CPU device
            time.sleep(1.2)  # JAX's CPU accounting runs about once a second
            tf.ones((256 * 1024 * 1024,), tf.float32)  # 1 GiB, above the BFC limit
    except tf.errors.ResourceExhaustedError as exc:
        result["raised"] = type(exc).__name__
    print("RESULT " + json.dumps(result))
"""


# One worker runs the module, so its TensorFlow program (some 20 s) runs once, not once per
# worker that got one of its tests.
pytestmark = pytest.mark.xdist_group("tf-bfc")


@pytest.fixture(scope="module")
def tf_run(tmp_path_factory: pytest.TempPathFactory) -> WatchedRun:
    env = {
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
        "TF_CPU_BFC_MEM_LIMIT_IN_MB": str(LIMIT_MB),
        "TF_CPP_MIN_LOG_LEVEL": "0",
    }
    return run_program(tmp_path_factory.mktemp("tf"), PROGRAM, env=env, timeout=120)


def tf_key(quantity: str) -> SeriesKey:
    return SeriesKey(f"tf.{quantity}", -1)


def test_bfc_usage_on_the_host_device_rises_and_falls_with_a_64_mib_tensor(
    tf_run: WatchedRun,
) -> None:
    trace = tf_run.trace()
    (allocated,) = trace.series_for("tf.allocated", device=-1)
    values = list(allocated.values)

    start = values[0]
    top = max(values)
    assert top - start >= 64 * MiB
    assert values[-1] - start < 64 * MiB  # freed again before the failed request
    (peaks,) = trace.series_for("tf.allocated_peak", device=-1)
    assert max(peaks.values) >= top
    (limit,) = trace.series_for("tf.limit", device=-1)
    assert set(limit.values) == {LIMIT_MB * MiB}


def test_a_real_resource_exhausted_error_becomes_a_tensorflow_oom_event(
    tf_run: WatchedRun,
) -> None:
    trace = tf_run.trace()

    assert tf_run.result == {"raised": "ResourceExhaustedError"}
    (oom,) = events_of(trace, EventKind.OOM)
    assert oom.data["oom"]["framework"] == "tensorflow"
    assert oom.data["oom"]["shape"] == [256 * 1024 * 1024]
    (exception,) = events_of(trace, EventKind.EXCEPTION)
    assert exception.data["where"] == "watch"
    # TensorFlow printed its BFC allocator dump to stderr, where `memdoc run` can read it.
    assert "BFCAllocator dump" in tf_run.process.stderr


def test_the_allocator_configuration_is_recorded_once_the_runtime_starts(
    tf_run: WatchedRun,
) -> None:
    (conf,) = events_of(tf_run.trace(), EventKind.ALLOCATOR_CONFIG, framework="tensorflow")

    assert conf.data["cpu_allocator"] == "bfc"
    assert conf.data["cpu_memory_limit_bytes"] == LIMIT_MB * MiB


def test_three_frameworks_in_one_process_are_each_attributed_in_the_same_trace(
    tf_run: WatchedRun,
) -> None:
    trace = tf_run.trace()

    assert set(trace.frameworks()) == {"pytorch", "tensorflow", "jax"}
    for name in ("pytorch", "tensorflow", "jax"):
        status = last_status(trace, name)
        assert status.available and status.version
    described = {e.data["name"]: e.data["devices"] for e in trace.events(EventKind.FRAMEWORK)}
    assert described["tensorflow"] == [
        {"index": -1, "name": "CPU:0", "kind": "cpu", "memory_stats": True}
    ]
    assert [d["index"] for d in described["jax"]] == [-1]
    (jax_bytes,) = trace.series_for("jax.allocated", device=-1)
    assert max(jax_bytes.values) >= 1 * MiB
    assert [s.data["source"] for s in trace.steps()] == ["optimizer"]
