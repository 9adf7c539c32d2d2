"""A snapshot becomes a trace: totals at the snapshot and over time, OOMs, settings, the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.importers import import_files
from memdoc.trace import EventKind, OomInfo
from memdoc.trace.reader import oom_of
from tests.importers.snapshot_dicts import (
    OOM_SNAPSHOT,
    T0_US,
    MiB,
    block,
    entry,
    fragmented_snapshot,
    segment,
    write_pickle,
)


def test_a_legacy_oom_snapshot_gives_the_totals_at_its_moment_and_says_what_it_cannot_tell() -> (
    None
):
    trace = import_files([OOM_SNAPSHOT])

    assert trace.header.mode == "import"
    assert [d.index for d in trace.devices()] == [0]
    assert trace.series("torch.allocated", 0).values.tolist() == [11_840_159_744]  # type: ignore[union-attr]
    assert trace.series("torch.reserved", 0).values.tolist() == [11_844_714_496]  # type: ignore[union-attr]
    assert trace.series("torch.largest_free", 0).values.tolist() == [2_080_768]  # type: ignore[union-attr]
    assert trace.oom_events() == []  # the file does not say it was taken at an OOM
    (snapshot,) = trace.events(EventKind.SNAPSHOT)
    assert Path(snapshot.data["path"]) == OOM_SNAPSHOT
    notes = " ".join(e.data["text"] for e in trace.events(EventKind.NOTE))
    assert "cannot tell whether it was taken at an OOM" in notes


def test_trace_entries_with_times_become_memory_over_time(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "s.pickle", fragmented_snapshot())
    trace = import_files([path])

    allocated = trace.series("torch.allocated", 0)
    reserved = trace.series("torch.reserved", 0)
    assert allocated is not None and reserved is not None
    assert trace.header.created_unix == pytest.approx(T0_US / 1e6)
    assert max(allocated.values) == 192 * MiB
    assert allocated.values[-1] == 120 * MiB
    assert reserved.values[-1] == 192 * MiB
    assert list(allocated.times) == sorted(allocated.times)
    assert trace.peak("torch.allocated", 0)[1] == 192 * MiB  # type: ignore[index]


def test_an_oom_entry_becomes_an_oom_event_with_the_failing_stack(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "s.pickle", fragmented_snapshot())
    trace = import_files([path])

    (event,) = trace.oom_events()
    oom = oom_of(event)
    assert isinstance(oom, OomInfo)
    assert (oom.framework, oom.device, oom.requested_bytes) == ("pytorch", 0, 50 * MiB)
    assert (oom.free_bytes, oom.allocated_bytes, oom.reserved_bytes) == (
        10 * MiB,
        120 * MiB,
        192 * MiB,
    )
    assert event.data["stack"] == [
        "/home/u/proj/train.py:12:main",
        "/home/u/proj/model.py:90:logits",
    ]
    assert trace.events(EventKind.SNAPSHOT)[0].data["reason"] == "oom"
    assert event.t == pytest.approx(trace.last_t, abs=0.01)


def test_the_allocator_settings_become_an_allocator_config_event(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "s.pickle", fragmented_snapshot(expandable_setting=True))
    (config,) = import_files([path]).events(EventKind.ALLOCATOR_CONFIG)
    assert config.data == {
        "framework": "pytorch",
        "alloc_conf": "expandable_segments:True",
        "backend": "native",
        "expandable_segments": True,
    }


def test_without_times_only_the_snapshot_moment_is_recorded(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "s.pickle", fragmented_snapshot(times=False))
    trace = import_files([path])
    assert trace.series("torch.allocated", 0).values.tolist() == [120 * MiB]  # type: ignore[union-attr]
    (event,) = trace.oom_events()
    assert oom_of(event).requested_bytes == 50 * MiB  # type: ignore[union-attr]
    notes = " ".join(e.data["text"] for e in trace.events(EventKind.NOTE))
    assert "no times" in notes


def test_an_empty_snapshot_is_a_trace_that_says_so(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "s.pickle", {"segments": [], "device_traces": []})
    trace = import_files([path])
    notes = " ".join(e.data["text"] for e in trace.events(EventKind.NOTE))
    assert "nothing was allocated" in notes


def test_expandable_segments_map_and_unmap_move_reserved_memory(tmp_path: Path) -> None:
    seg = 0x7F00_0000_0000
    raw = {
        "segments": [
            segment(seg, [block(seg, 20 * MiB, "active_allocated")], expandable=True),
        ],
        "device_traces": [
            [
                entry("segment_map", 40 * MiB, T0_US, addr=seg),
                entry("alloc", 20 * MiB, T0_US + 1000, addr=seg),
                entry("alloc", 20 * MiB, T0_US + 2000, addr=seg + 20 * MiB),
                entry("free_requested", 20 * MiB, T0_US + 3000, addr=seg + 20 * MiB),
                entry("segment_unmap", 20 * MiB, T0_US + 4000, addr=seg + 20 * MiB),
            ]
        ],
    }
    trace = import_files([write_pickle(tmp_path / "s.pickle", raw)])
    reserved = trace.series("torch.reserved", 0)
    allocated = trace.series("torch.allocated", 0)
    assert reserved is not None and allocated is not None
    assert [v / MiB for v in reserved.values] == [40, 40, 40, 40, 20]
    assert [v / MiB for v in allocated.values] == [0, 20, 40, 20, 20]
    (config,) = trace.events(EventKind.ALLOCATOR_CONFIG)
    assert config.data["expandable_segments"] is True


def test_record_function_annotations_become_marks(tmp_path: Path) -> None:
    raw = fragmented_snapshot()
    raw["external_annotations"] = [
        {"name": "validation", "stage": "START", "device": 0, "time_us": T0_US + 5},
        {"name": "validation", "stage": "END", "device": 0, "time_us": T0_US + 9},
    ]
    trace = import_files([write_pickle(tmp_path / "s.pickle", raw)])
    (mark,) = trace.marks()
    assert mark.data["label"] == "validation"
    assert mark.t == pytest.approx(0.0, abs=0.001)
