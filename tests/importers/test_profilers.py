"""Profiler outputs of PyTorch, JAX and TensorFlow become framework memory over time.

Oracles: the JSON read independently, and Google's protobuf runtime with TensorFlow's own
generated message classes (loaded from their files, without importing TensorFlow)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from memdoc.importers import detect, import_files
from memdoc.importers.jax_pprof import buffer_bytes_by_device, jax_holders, read_pprof
from memdoc.importers.tf_xplane import memory_events
from memdoc.trace import EventKind
from tests.importers.snapshot_dicts import HTA, XPLANE

TF_PROTOS = Path(importlib.util.find_spec("tensorflow").origin).parent / "tsl/profiler/protobuf"  # type: ignore[arg-type, union-attr]


def _generated(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TF_PROTOS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- PyTorch profiler -------------------------------------------------------------------------


def test_a_chrome_trace_gives_allocated_and_reserved_per_device() -> None:
    path = HTA / "df_index_resolver.json.gz"
    assert detect(path) == "torch-profiler-trace"
    # Read independently of any JSON parser: the memory events' fields, as text.
    text = gzip.decompress(path.read_bytes()).decode()
    cuda = [
        (int(ts), int(total))
        for ts, total in re.findall(
            r'"ts": (\d+),[^{}]*"args": \{[^{}]*"Device Type": 1,[^{}]*"Total Allocated": (\d+)',
            text,
        )
    ]

    trace = import_files([path])

    allocated = trace.series("torch.allocated", 1)
    reserved = trace.series("torch.reserved", 1)
    assert allocated is not None and reserved is not None
    assert len(allocated) == len(cuda) == 26770
    assert max(allocated.values) == max(total for _, total in cuda)
    earliest = min(range(len(cuda)), key=lambda i: cuda[i][0])  # the first of equal times
    assert allocated.values[0] == cuda[earliest][1]
    assert reserved.values[-1] == 12_782_141_440  # the same in every event, read by eye
    device = trace.devices_by_index[1]
    assert (device.name, device.total_bytes) == ("Tesla V100-SXM2-32GB", 34_089_730_048)
    assert trace.series("torch.allocated", -1) is not None  # CPU events go to the host index
    times = [int(t) for t in re.findall(r'"\[memory\]",[^{}]*"ts": (\d+)', text)]
    assert trace.duration_s == pytest.approx((max(times) - min(times)) / 1e6, abs=0.001)


def test_a_memory_timeline_gives_allocated_over_time_and_the_model_state_at_the_peak() -> None:
    path = HTA / "memory_timeline.raw.gz"
    assert detect(path) == "torch-memory-timeline"
    rows = json.loads(gzip.decompress(path.read_bytes()))
    total = peak = 0
    for _, _, size, _ in rows:
        total += size
        peak = max(peak, total)

    trace = import_files([path])

    allocated = trace.series("torch.allocated", 0)
    assert allocated is not None
    assert allocated.values[-1] == total == 332_060_904
    assert trace.peak("torch.allocated", 0)[1] == peak == 3_082_832_104  # type: ignore[index]
    (state,) = trace.events(EventKind.MODEL_STATE)
    at_peak = state.data["categories_at_peak"]
    assert sum(at_peak.values()) == peak
    assert state.data["param_bytes"] == at_peak["parameter"] > 0
    assert state.data["optimizer_state_bytes"] == at_peak["optimizer_state"]
    assert trace.duration_s == pytest.approx(0.987, abs=0.002)


def test_a_chrome_trace_without_memory_events_says_how_to_record_them(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"name": "aten::mm", "ph": "X", "ts": 1}]}))
    from memdoc.errors import InputError

    with pytest.raises(InputError) as error:
        import_files([path])
    assert "profile_memory=True" in (error.value.hint or "")


# -- JAX --------------------------------------------------------------------------------------

_JAX_PROGRAM = """
import sys
import jax
import jax.numpy as jnp

def make_weights():
    return jnp.ones((512, 512), dtype=jnp.float32)

weights = make_weights()
labels = jnp.zeros((1000,), dtype=jnp.int8)
with open(sys.argv[1], "wb") as out:
    out.write(jax.profiler.device_memory_profile())
"""


# One worker runs the module: its shared run is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("jax-profile")


@pytest.fixture(scope="module")
def jax_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A device memory profile written by JAX itself, on CPU."""
    folder = tmp_path_factory.mktemp("jax")
    program = folder / "program.py"
    program.write_text(_JAX_PROGRAM)
    profile = folder / "memory.prof"
    subprocess.run(
        [sys.executable, str(program), str(profile)],
        check=True,
        timeout=120,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    return profile


def test_a_jax_profile_gives_live_buffer_bytes(jax_profile: Path) -> None:
    assert detect(jax_profile) == "jax-memory-profile"
    pprof = _generated("profile_pb2").Profile()
    pprof.ParseFromString(gzip.decompress(jax_profile.read_bytes()))
    strings = list(pprof.string_table)
    space = [strings[t.type] for t in pprof.sample_type].index("space")
    expected = sum(
        s.value[space]
        for s in pprof.sample
        if any(strings[label.key] == "kind" and strings[label.str] == "buffer" for label in s.label)
    )

    samples = read_pprof(jax_profile)

    assert buffer_bytes_by_device(samples) == {-1: expected}
    assert expected >= 512 * 512 * 4 + 1000
    trace = import_files([jax_profile])
    assert trace.series("jax.allocated", -1).values.tolist() == [expected]  # type: ignore[union-attr]


def test_jax_buffers_are_filed_under_the_programs_own_lines(jax_profile: Path) -> None:
    holders = jax_holders(read_pprof(jax_profile))
    top = holders.top[0]
    assert top.label.startswith("program.py:")
    assert top.label.endswith("make_weights")
    assert top.live_bytes == 512 * 512 * 4


# -- TensorFlow -------------------------------------------------------------------------------


def test_an_xplane_gives_every_allocator_event_with_its_stats() -> None:
    space = _generated("xplane_pb2").XSpace()
    space.ParseFromString(XPLANE.read_bytes())
    host = space.planes[0]
    names = {k: m.name for k, m in host.event_metadata.items()}
    stats = {k: m.name for k, m in host.stat_metadata.items()}
    expected = []
    for line in host.lines:
        for event in line.events:
            if names[event.metadata_id] in ("MemoryAllocation", "MemoryDeallocation"):
                values = {stats[s.metadata_id]: s for s in event.stats}
                allocator = values["allocator_name"]
                allocated = values["bytes_allocated"]
                expected.append(
                    (
                        line.timestamp_ns + event.offset_ps // 1000,
                        allocator.str_value or stats[allocator.ref_value],
                        allocated.int64_value or allocated.uint64_value,
                    )
                )

    events = memory_events(XPLANE)

    assert len(events) == len(expected) == 1859 + 634
    mine = sorted((e.t_ns, e.stats["allocator_name"], e.stats["bytes_allocated"]) for e in events)
    assert mine == sorted(expected)


def test_an_xplane_becomes_tensorflow_memory_per_gpu() -> None:
    assert detect(XPLANE) == "tf-xplane"
    trace = import_files([XPLANE])
    devices = sorted(k.device or 0 for k in trace.series_keys() if k.metric == "tf.allocated")
    assert devices == [-1, 1, 4, 6]
    for device in (4, 6):
        allocated = trace.series("tf.allocated", device)
        limit = trace.series("tf.limit", device)
        assert allocated is not None and limit is not None
        assert len(allocated) == 969
        assert all(a <= cap for a, cap in zip(allocated.values, limit.values, strict=True))
