"""The memory ledger: every byte of the device is accounted for, and unknowns are named."""

from __future__ import annotations

import pytest

from memdoc.trace import SCHEMA_VERSION, Header, Metric, OomInfo, ProcessUsage, SeriesKey, Trace
from memdoc.trace.ledger import (
    ALLOCATED,
    CACHED_FREE,
    FREE,
    OTHER_PROCESSES,
    PROCESS_OTHER,
    UNEXPLAINED,
    Readings,
    build_ledger,
    ledger_at,
    readings_from_oom,
)
from memdoc.units import GiB, MiB, parse_size

PID = 4243
OTHER_PID = 9001


def _size(text: str) -> int:
    value = parse_size(text)
    assert value is not None
    return value


def _trace(mode: str = "run") -> Trace:
    """A 100 GiB device sampled at 1 s and 2 s: PyTorch in PID, another process beside it."""
    header = Header(
        version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="test", pid=PID, mode=mode
    )
    trace = Trace(header)
    trace.add_values(0.0, [(SeriesKey(Metric.GPU_TOTAL, 0), 100 * GiB)])
    for t, allocated in ((1.0, 10 * GiB), (2.0, 30 * GiB)):
        reserved = allocated + 2 * GiB
        used = reserved + 1 * GiB + 5 * GiB + 512 * MiB  # context, other process, driver
        trace.add_values(
            t,
            [
                (SeriesKey("torch.allocated", 0, PID), allocated),
                (SeriesKey("torch.reserved", 0, PID), reserved),
                (SeriesKey(Metric.GPU_USED, 0), used),
                (SeriesKey(Metric.GPU_FREE, 0), 100 * GiB - used),
                (SeriesKey(Metric.GPU_PROC_USED, 0, PID), reserved + 1 * GiB),
                (SeriesKey(Metric.GPU_PROC_USED, 0, OTHER_PID), 5 * GiB),
            ],
        )
    return trace


def test_a_trace_ledger_splits_the_device_and_names_the_driver_remainder() -> None:
    ledger = ledger_at(_trace(), 0, 1.5)

    assert [(t.key, t.bytes) for t in ledger.terms] == [
        (ALLOCATED, 10 * GiB),
        (CACHED_FREE, 2 * GiB),
        (PROCESS_OTHER, 1 * GiB),
        (OTHER_PROCESSES, 5 * GiB),
        (FREE, 100 * GiB - 18 * GiB - 512 * MiB),
        (UNEXPLAINED, 512 * MiB),
    ]
    assert ledger.accounted_bytes == ledger.total_bytes == 100 * GiB
    assert ledger.unknown == ()


def test_a_trace_ledger_reads_nothing_recorded_after_its_instant() -> None:
    before_any = ledger_at(_trace(), 0, 0.5)

    assert ledger_at(_trace(), 0, 1.999).term(ALLOCATED) == 10 * GiB
    assert ledger_at(_trace(), 0, 2.0).term(ALLOCATED) == 30 * GiB
    assert before_any.term(ALLOCATED) is None
    assert set(before_any.unknown) == {PROCESS_OTHER, OTHER_PROCESSES, FREE}
    assert before_any.term(UNEXPLAINED) == 100 * GiB


def test_a_system_view_counts_every_process_as_just_a_process() -> None:
    # `memdoc top` watches the machine: its own PID in the header is not a run.
    trace = Trace(
        Header(version=SCHEMA_VERSION, created_unix=0.0, memdoc_version="", pid=1, mode="system")
    )
    trace.add_values(0.0, [(SeriesKey(Metric.GPU_TOTAL, 0), 24 * GiB)])
    trace.add_values(
        1.0,
        [
            (SeriesKey(Metric.GPU_FREE, 0), 4 * GiB),
            (SeriesKey(Metric.GPU_PROC_USED, 0, OTHER_PID), 19 * GiB),
        ],
    )

    ledger = ledger_at(trace, 0, 1.0)

    assert not ledger.run_known
    assert [(t.label, t.bytes) for t in ledger.terms] == [
        ("processes", 19 * GiB),
        ("free", 4 * GiB),
        ("unexplained remainder", 1 * GiB),
    ]
    assert ledger.unknown == ()


def test_the_remainder_is_exactly_what_no_reading_explains() -> None:
    readings = Readings(
        total_bytes=100 * GiB,
        free_bytes=10 * GiB,
        allocated_bytes={"pytorch": 50 * GiB},
        reserved_bytes={"pytorch": 60 * GiB},
        this_process_bytes=65 * GiB,
        other_processes_bytes=20 * GiB,
    )

    ledger = build_ledger(0, "peak", 1.0, readings)

    assert [(t.key, t.bytes // GiB) for t in ledger.terms] == [
        (ALLOCATED, 50),
        (CACHED_FREE, 10),
        (PROCESS_OTHER, 5),
        (OTHER_PROCESSES, 20),
        (FREE, 10),
        (UNEXPLAINED, 5),
    ]
    assert ledger.unknown == ()


def test_terms_nobody_measured_are_named_and_left_in_the_remainder() -> None:
    # A framework collector alone: no driver figures for processes.
    readings = Readings(
        total_bytes=80 * GiB, free_bytes=30 * GiB, allocated_bytes={"pytorch": 40 * GiB}
    )

    ledger = build_ledger(0, "peak", 1.0, readings)

    assert ledger.accounted_bytes == 80 * GiB
    assert ledger.term(UNEXPLAINED) == 10 * GiB
    assert "other processes" in ledger.unknown_labels
    assert any("context" in name for name in ledger.unknown_labels)


def test_without_a_device_total_no_remainder_is_invented() -> None:
    ledger = build_ledger(0, "peak", 1.0, Readings(allocated_bytes={"pytorch": 4 * GiB}))

    assert ledger.term(UNEXPLAINED) is None
    assert any("device total unknown" in note for note in ledger.notes)


def test_a_lone_other_process_holding_our_whole_pool_is_taken_as_this_process() -> None:
    # Source: Tianhao-Qi/Mask2DiT#4 (catalogue 1g): in a container the message shows the
    # host PID, so "Process 76883 has 53.16 GiB" is this very process.
    oom = OomInfo(
        framework="pytorch",
        device=0,
        requested_bytes=_size("35.60 GiB"),
        total_bytes=_size("79.33 GiB"),
        free_bytes=_size("26.16 GiB"),
        allocated_bytes=_size("11.97 GiB"),
        reserved_unallocated_bytes=_size("40.69 GiB"),
        processes=(ProcessUsage(76883, _size("53.16 GiB"), False),),
    )

    ledger = build_ledger(0, "oom", 1.0, readings_from_oom(oom, Readings()))

    assert ledger.term(OTHER_PROCESSES) == 0
    assert ledger.term(PROCESS_OTHER) == _size("53.16 GiB") - _size("11.97 GiB") - _size(
        "40.69 GiB"
    )
    assert ledger.accounted_bytes == _size("79.33 GiB")
    assert 0 <= (ledger.term(UNEXPLAINED) or 0) < 50 * MiB
    assert any("PID namespace" in note for note in ledger.notes)


def test_a_process_holding_less_than_our_pool_stays_another_process() -> None:
    oom = OomInfo(
        framework="pytorch",
        total_bytes=16 * GiB,
        allocated_bytes=10 * GiB,
        reserved_bytes=11 * GiB,
        processes=(ProcessUsage(555, 2 * GiB, False),),
    )

    ledger = build_ledger(0, "oom", 1.0, readings_from_oom(oom, Readings()))

    assert ledger.term(OTHER_PROCESSES) == 2 * GiB


def test_a_sentinel_for_this_process_falls_back_to_the_samples() -> None:
    # NVML reports 2^64 - 1 when it cannot tell; that is no amount of memory.
    oom = OomInfo(
        framework="pytorch",
        total_bytes=16 * GiB,
        allocated_bytes=10 * GiB,
        this_process_bytes=2**64 - 1,
    )

    readings = readings_from_oom(oom, Readings(this_process_bytes=12 * GiB))

    assert readings.this_process_bytes == 12 * GiB


@pytest.mark.parametrize(
    ("framework", "says"),
    [
        pytest.param("jax", "XLA_PYTHON_CLIENT_PREALLOCATE", id="jax"),
        pytest.param("tensorflow", "memory growth", id="tensorflow"),
    ],
)
def test_a_preallocated_pool_is_explained_not_alarming(framework: str, says: str) -> None:
    readings = Readings(
        total_bytes=80 * GiB,
        allocated_bytes={framework: 2 * GiB},
        reserved_bytes={framework: 60 * GiB},
    )

    ledger = build_ledger(0, "peak", 1.0, readings)

    assert any(says in note for note in ledger.notes)


def test_a_small_pool_gets_no_preallocation_note() -> None:
    readings = Readings(total_bytes=80 * GiB, reserved_bytes={"jax": 2 * GiB})

    assert not any("preallocate" in n.lower() for n in build_ledger(0, "peak", 1.0, readings).notes)
