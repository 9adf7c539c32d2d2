"""The memory ledger: every byte of the device is accounted for, and unknowns are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.report.ledger import (
    ALLOCATED,
    CACHED_FREE,
    FREE,
    OTHER_PROCESSES,
    PROCESS_OTHER,
    UNEXPLAINED,
    Readings,
    build_ledger,
    device_ledgers,
    readings_from_oom,
)
from memdoc.trace import OomInfo, ProcessUsage, load_trace
from memdoc.units import GiB, MiB, parse_size
from tests.report.traces import H200_TOTAL, oom_1g, write_clean_h200_run, write_oom_run


def _size(text: str) -> int:
    value = parse_size(text)
    assert value is not None
    return value


def test_terms_add_up_to_the_device_total_at_peak_and_at_the_oom(tmp_path: Path) -> None:
    trace = load_trace(write_oom_run(tmp_path / "run.memdoc"))
    oom = trace.ending_oom()

    ledgers = device_ledgers(trace, oom, trace.oom_events()[-1].t)

    assert [lg.moment for lg in ledgers] == ["peak", "oom"]
    for ledger in ledgers:
        assert ledger.total_bytes == _size("15.58 GiB")
        assert ledger.accounted_bytes == ledger.total_bytes
        assert all(term.bytes >= 0 for term in ledger.terms), ledger.terms


def test_terms_add_up_on_every_device_of_a_multi_gpu_run(tmp_path: Path) -> None:
    trace = load_trace(write_clean_h200_run(tmp_path / "run.memdoc", devices=2))

    ledgers = device_ledgers(trace, None, None)

    assert [(lg.device, lg.moment) for lg in ledgers] == [(0, "peak"), (1, "peak")]
    assert [lg.accounted_bytes for lg in ledgers] == [H200_TOTAL, H200_TOTAL]


def test_the_oom_ledger_takes_the_numbers_of_the_error_message(tmp_path: Path) -> None:
    trace = load_trace(write_oom_run(tmp_path / "run.memdoc"))

    at_oom = device_ledgers(trace, trace.ending_oom(), 23.0)[-1]

    assert at_oom.source == "oom message"
    assert at_oom.term(ALLOCATED) == _size("13.64 GiB")
    assert at_oom.term(CACHED_FREE) == _size("67.23 MiB")
    assert at_oom.term(FREE) == _size("71.25 MiB")
    # What the driver counts for this process beyond PyTorch's pool: context and the like.
    reserved = _size("13.64 GiB") + _size("67.23 MiB")
    assert at_oom.term(PROCESS_OTHER) == _size("13.94 GiB") - reserved
    # The message does not list other processes: the trace's per-process sample does.
    assert at_oom.term(OTHER_PROCESSES) == pytest.approx(1.0 * GiB)


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
    assert "other processes" in ledger.unknown
    assert any("context" in name for name in ledger.unknown)


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
    oom = oom_1g()
    with_other = OomInfo(**{**oom.__dict__, "processes": (ProcessUsage(555, 2 * GiB, False),)})

    ledger = build_ledger(0, "oom", 1.0, readings_from_oom(with_other, Readings()))

    assert ledger.term(OTHER_PROCESSES) == 2 * GiB


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
