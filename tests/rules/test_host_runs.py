"""CPU-only runs are diagnosed from host memory, and their summary says host memory ran out."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from memdoc.report.summary import print_end_of_run
from memdoc.rules.engine import diagnose
from memdoc.trace import EventKind, Metric, OomInfo, SeriesKey, load_trace
from tests.rules.host_scenarios import FORWARD, jax_host_failure, torch_host_failure
from tests.rules.recorder import GiB, MiB, Recorder

PROGRAM = textwrap.dedent(
    """
    import sys, time
    import memdoc

    kept = []
    with memdoc.watch(sys.argv[1], interval=0.02, quiet=True):
        for step in range(12):
            block = bytearray(40 * 1024 * 1024)
            if sys.argv[2] == "leak":
                kept.append(block)  # never released
            scratch = bytearray(30 * 1024 * 1024)
            time.sleep(0.05)
            del block, scratch
            memdoc.step()
    """
)


def _watched_run(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(PROGRAM, encoding="utf-8")
    trace_path = tmp_path / "run.memdoc"
    subprocess.run([sys.executable, str(script), str(trace_path), mode], check=True, timeout=120)
    return [f.rule for f in diagnose(load_trace(trace_path))]


@pytest.mark.parametrize(
    ("mode", "leaks"),
    [
        pytest.param("leak", True, id="keeps-a-block-per-step"),
        pytest.param("free", False, id="frees-it"),
    ],
)
def test_a_host_memory_leak_is_found_from_rss_at_step_boundaries(
    tmp_path: Path, mode: str, leaks: bool
) -> None:
    rules = _watched_run(tmp_path, mode)

    assert ("leak-across-steps" in rules) is leaks, rules


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(
            lambda p: torch_host_failure(
                p, stack=FORWARD, requested=89_478_400, rlimit=1_419_857_920, peak=700 * MiB
            ),
            id="pytorch-cpu-allocator",
        ),
        pytest.param(lambda p: jax_host_failure(p, live_array_bytes=None), id="jax-on-the-cpu"),
    ],
)
def test_the_end_of_run_summary_says_host_memory_ran_out_not_gpu_memory(
    tmp_path: Path, build: Callable[[Path], None]
) -> None:
    trace = tmp_path / "run.memdoc"
    build(trace)
    stream = io.StringIO()

    print_end_of_run([trace], stream)

    # Both ran under an address-space cap: the line names it, not the RAM.
    first = stream.getvalue().splitlines()[0]
    assert first.startswith("memdoc: Ran out of host memory under its ")
    assert first.endswith(" GiB address-space cap")


@pytest.mark.parametrize(
    ("requested", "address_space", "fires"),
    [
        pytest.param(966_328_320, 2_278_000_000, True, id="a-quarter-of-the-cap-beyond-the-room"),
        pytest.param(40 * MiB, 2_340_000_000, False, id="a-small-request-in-a-full-space"),
        pytest.param(966_328_320, 1_000_000_000, False, id="room-enough-for-it"),
    ],
)
def test_under_an_address_space_cap_one_big_request_beyond_the_room_left_is_named(
    tmp_path: Path, requested: int, address_space: float, fires: bool
) -> None:
    path = tmp_path / "run.memdoc"
    jax_host_failure(
        path, live_array_bytes=966_328_344, address_space_bytes=address_space, requested=requested
    )

    found = {f.rule: f for f in diagnose(load_trace(path))}
    finding = found.get("single-allocation-too-large")

    if fires:
        assert finding is not None and finding.confidence >= 0.5
        assert any("room left under the cap" in e.text for e in finding.evidence)
    else:
        assert finding is None or not any(
            "room left under the cap" in e.text for e in finding.evidence
        )


@pytest.mark.parametrize(
    ("bfc_limit", "first_line"),
    [
        pytest.param(
            512 * MiB,
            "memdoc: Ran out of TensorFlow's 512.0 MiB CPU allocator limit",
            id="its-own-limit-below-the-ram",
        ),
        pytest.param(None, "memdoc: Ran out of host memory (RAM)", id="no-limit-of-its-own"),
    ],
)
def test_a_framework_allocator_with_a_limit_of_its_own_on_the_cpu_is_named_as_what_ran_out(
    tmp_path: Path, bfc_limit: int | None, first_line: str
) -> None:
    # TensorFlow's BFC allocator on the CPU (TF_CPU_BFC_MEM_LIMIT_IN_MB) stops at its limit.
    path = tmp_path / "run.memdoc"
    rec = Recorder(path)
    rec.event(0.5, EventKind.FRAMEWORK, name="tensorflow", version="2.21.0")
    rec.sample(0.6, {SeriesKey(Metric.HOST_TOTAL): 24 * GiB, SeriesKey(Metric.HOST_RSS): GiB})
    oom = OomInfo(
        framework="tensorflow",
        kind="allocator",
        device=0,
        device_type="cpu",
        requested_bytes=GiB,
        bfc_limit_bytes=bfc_limit,
        message="OOM when allocating tensor with shape[268435456] and type float on CPU:0",
    )
    rec.oom(1.0, oom)
    rec.end(1.5, exit_code=1)
    stream = io.StringIO()

    print_end_of_run([path], stream)

    assert stream.getvalue().splitlines()[0] == first_line


def test_the_evidence_names_a_limit_once_when_the_jobs_limit_is_the_failing_process_cap(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.memdoc"
    torch_host_failure(
        path, stack=FORWARD, requested=89_478_400, rlimit=1_419_857_920, peak=700 * MiB
    )

    (host,) = [f for f in diagnose(load_trace(path)) if f.rule == "host-oom"]

    texts = [e.text for e in host.evidence]
    assert len(texts) == len(set(texts)), texts
    assert any(t.startswith("address-space cap (RLIMIT_AS)") for t in texts)
