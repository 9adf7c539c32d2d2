"""Snapshots of every format era parse into the same records, and agree with PyTorch's own tools."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from torch.cuda import _memory_viz

from memdoc.importers.safe_pickle import load_plain_pickle
from memdoc.importers.torch_snapshot import NotASnapshot, parse_snapshot, read_snapshot
from tests.importers.snapshot_dicts import (
    OOM_SNAPSHOT,
    OPT_SNAPSHOT,
    MiB,
    block,
    fragmented_snapshot,
    segment,
    write_pickle,
)


def _flamegraph_lines(data: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(state, stack, bytes) of PyTorch's own flame graph text for a snapshot."""
    text = _memory_viz.memory(copy.deepcopy(data), format_flamegraph=lambda lines: lines)  # type: ignore[no-untyped-call]
    rows = []
    for line in text.splitlines():
        stack, size = line.rsplit(" ", 1)
        _, state, frames = stack.split(";", 2)
        rows.append((state, frames, int(size)))
    return rows


@pytest.mark.parametrize("path", [OOM_SNAPSHOT, OPT_SNAPSHOT], ids=["oom", "opt-1.3b"])
def test_legacy_snapshots_agree_with_pytorchs_own_totals(path: Path) -> None:
    raw = load_plain_pickle(path)
    oracle = _flamegraph_lines(raw)
    snapshot = read_snapshot(path)

    blocks = [b for s in snapshot.segments for b in s.blocks]
    requested_live = sum(b.requested_bytes for b in blocks if b.allocated)
    assert snapshot.era == "history"
    assert requested_live == sum(
        size for state, frames, size in oracle if state == "active_allocated" and frames != "<gaps>"
    )
    active = [_memory_viz.calc_active(s) for s in raw["segments"]]  # type: ignore[no-untyped-call]
    assert sum(b.size_bytes for b in blocks if b.allocated) == sum(active)
    assert sum(s.total_bytes for s in snapshot.segments) == sum(
        s["total_size"] for s in raw["segments"]
    )


def test_the_flexgen_oom_snapshot_reads_as_documented() -> None:
    snapshot = read_snapshot(OOM_SNAPSHOT)
    assert len(snapshot.segments) == 176
    assert sum(len(s.blocks) for s in snapshot.segments) == 463
    assert sum(1 for s in snapshot.segments for b in s.blocks if b.allocated) == 460
    assert snapshot.devices() == [0]
    (only,) = snapshot.trace_on(0)
    assert (only.action, only.size_bytes, only.time_us) == ("snapshot", 11_840_159_744, None)
    assert snapshot.ooms(0) == []
    assert snapshot.expandable_segments is None  # PyTorch 2.0 did not record it


def test_legacy_blocks_take_their_stack_from_the_newest_history_entry() -> None:
    snapshot = read_snapshot(OOM_SNAPSHOT)
    first = snapshot.segments[0].blocks[0]
    assert first.address == snapshot.segments[0].address
    assert first.frames[0].filename.endswith("flexgen/pytorch_backend.py")
    assert (first.frames[0].line, first.frames[0].name) == (190, "allocate")


def test_legacy_blocks_get_addresses_from_their_segment() -> None:
    snapshot = read_snapshot(OPT_SNAPSHOT)
    for seg in snapshot.segments:
        assert seg.blocks[0].address == seg.address
        for before, after in zip(seg.blocks, seg.blocks[1:], strict=False):
            assert after.address == before.address + before.size_bytes


def test_current_era_snapshots_agree_with_pytorchs_own_totals() -> None:
    raw = fragmented_snapshot()
    oracle = _flamegraph_lines(raw)
    snapshot = parse_snapshot(copy.deepcopy(raw))

    assert snapshot.era == "frames"
    live = [b for s in snapshot.segments for b in s.blocks if b.allocated]
    assert sum(b.requested_bytes for b in live) == sum(
        size for state, _, size in oracle if state == "active_allocated"
    )
    summary = _memory_viz.segsum(copy.deepcopy(raw))  # type: ignore[no-untyped-call]
    assert "total_reserved: 192.0MiB" in summary
    assert "total_allocated: 120.0MiB" in summary
    assert "total_free: 72.0MiB" in summary


def test_current_era_fields_are_read() -> None:
    raw = fragmented_snapshot(free_segment=True, expandable_setting=True)
    raw["segments"][0]["is_expandable"] = True
    snapshot = parse_snapshot(raw)

    assert snapshot.expandable_segments is True
    assert snapshot.segments[0].is_expandable
    assert snapshot.segments[-1].pool_id == (1, 7)
    (oom,) = snapshot.ooms(0)
    assert oom.address is None
    assert (oom.size_bytes, oom.device_free_bytes) == (50 * MiB, 10 * MiB)
    assert oom.time_us is not None
    assert [f.name for f in oom.frames] == ["logits", "main"]


def test_entries_without_time_parse_with_no_time() -> None:
    snapshot = parse_snapshot(fragmented_snapshot(times=False))
    assert all(e.time_us is None for e in snapshot.trace_on(0))


def test_pending_free_blocks_are_neither_allocated_nor_free() -> None:
    raw = fragmented_snapshot()
    raw["segments"][0]["blocks"][1]["state"] = "active_pending_free"
    raw["segments"][1]["blocks"][1]["state"] = "active_awaiting_free"
    snapshot = parse_snapshot(raw)
    states = [b for s in snapshot.segments[:2] for b in s.blocks[1:]]
    assert not any(b.allocated or b.free for b in states)


def test_shared_frames_become_one_shared_stack() -> None:
    frames = [{"filename": "/p/a.py", "line": 1, "name": "f"}]
    blocks = [block(i * 512, 512, "active_allocated", frames) for i in range(3)]
    snapshot = parse_snapshot({"segments": [segment(0, blocks)], "device_traces": []})
    stacks = [b.frames for b in snapshot.segments[0].blocks]
    assert stacks[0] is stacks[1] is stacks[2]


def test_several_devices_are_kept_apart() -> None:
    one = segment(0, [block(0, 2 * MiB, "active_allocated")], device=0)
    two = segment(1 << 40, [block(1 << 40, 4 * MiB, "active_allocated")], device=3)
    snapshot = parse_snapshot({"segments": [one, two], "device_traces": [[], [], [], []]})
    assert snapshot.devices() == [0, 3]
    assert [s.total_bytes for s in snapshot.segments_on(3)] == [4 * MiB]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param([1, 2, 3], id="a-list"),
        pytest.param({"device_traces": []}, id="no-segments"),
        pytest.param({"segments": [{"blocks": []}]}, id="segment-without-size"),
        pytest.param({"segments": [{"total_size": 1, "blocks": [7]}]}, id="block-not-a-dict"),
        pytest.param({"segments": [], "device_traces": {"0": []}}, id="traces-not-a-list"),
    ],
)
def test_plain_data_that_is_not_a_snapshot_is_refused(tmp_path: Path, data: Any) -> None:
    path = write_pickle(tmp_path / "x.pickle", data)
    with pytest.raises(NotASnapshot) as refused:
        read_snapshot(path)
    assert str(path) in refused.value.message


def test_one_block_shared_a_million_times_is_refused_not_walked(tmp_path: Path) -> None:
    # 40 KB of pickle that name one block a million times over.
    one = block(0, 512, "active_allocated")
    blocks = [one] * 20_000
    seg = segment(0, [one])
    seg["blocks"] = blocks
    path = write_pickle(tmp_path / "shared.pickle", {"segments": [seg] * 50})
    with pytest.raises(NotASnapshot, match="reused over and over"):
        read_snapshot(path)


def test_reading_a_file_consumes_its_dict_as_it_goes(tmp_path: Path) -> None:
    raw = fragmented_snapshot()
    snapshot = parse_snapshot(raw, consume=True)
    assert raw["segments"] == [None, None, None]
    assert len(snapshot.segments) == 3
