"""The answers a snapshot gives: who holds the memory, how fragmented, what would have helped."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path, PurePath
from typing import Any

import pytest
from torch.cuda import _memory_viz

from memdoc.importers.allocations import (
    SnapshotAnalysis,
    analyse_snapshot,
    analyse_snapshot_file,
)
from memdoc.importers.holders import is_user_frame, site_of
from memdoc.importers.safe_pickle import load_plain_pickle
from memdoc.importers.torch_snapshot import Frame, parse_snapshot
from memdoc.importers.what_if import cuda_request_bytes, round_size
from tests.importers.snapshot_dicts import (
    OOM_SNAPSHOT,
    OPT_SNAPSHOT,
    MiB,
    fragmented_snapshot,
)


def _analyse(**options: Any) -> SnapshotAnalysis:
    return analyse_snapshot(parse_snapshot(fragmented_snapshot(**options)))


# -- who holds the memory ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [OOM_SNAPSHOT, OPT_SNAPSHOT], ids=["oom", "opt-1.3b"])
def test_holders_match_pytorchs_flame_graph_grouped_by_innermost_frame(path: Path) -> None:
    # FlexGen's stacks hold only its own code, so the first user frame is the innermost one.
    raw = load_plain_pickle(path)
    text = _memory_viz.memory(raw, format_flamegraph=lambda lines: lines)  # type: ignore[no-untyped-call]
    expected: Counter[str] = Counter()
    for line in text.splitlines():
        stack, size = line.rsplit(" ", 1)
        _, state, frames = stack.split(";", 2)
        if state == "active_allocated" and frames != "<gaps>":
            expected[frames.split(";")[-1]] += int(size)

    analysis = analyse_snapshot_file(path, top_n=1000)

    found = {
        f"{PurePath(h.site.filename).name}:{h.site.line}:{h.site.name}": h.live_bytes
        for h in analysis.at_snapshot.top
        if h.site is not None
    }
    assert found == dict(expected)
    assert analysis.at_snapshot.total_live_bytes == sum(expected.values())


def test_the_flexgen_oom_is_all_weights_allocated_from_one_helper() -> None:
    analysis = analyse_snapshot_file(OOM_SNAPSHOT)
    (top,) = analysis.at_snapshot.top
    assert top.label == "pytorch_backend.py:190 allocate"
    assert top.allocations == 460
    assert top.share == 1.0
    assert [f.name for f in top.stack][:3] == ["allocate", "init_weight_list", "init_weight"]
    assert analysis.reserved_bytes == 11_844_714_496
    assert analysis.allocated_bytes == 11_840_159_744
    assert analysis.oom is None
    assert analysis.at_peak is None  # a one-entry trace places no earlier peak


def test_holders_at_the_peak_come_from_replaying_the_trace() -> None:
    analysis = _analyse()
    now = {h.label: h.live_bytes for h in analysis.at_snapshot.top}
    assert now == {"model.py:40 forward": 120 * MiB}
    assert analysis.at_peak is not None
    peak = {h.label: (h.live_bytes, h.allocations) for h in analysis.at_peak.top}
    assert peak == {
        "model.py:40 forward": (120 * MiB, 3),
        # the softmax frame inside torch is skipped: the program's own line is named
        "model.py:77 attention": (72 * MiB, 3),
    }
    assert analysis.peak_allocated_bytes == 192 * MiB
    assert analysis.at_peak.time_us is not None
    assert analysis.at_peak.top[1].share == pytest.approx(72 / 192)


def test_holders_beyond_the_top_are_summed_as_other() -> None:
    analysis = analyse_snapshot_file(OPT_SNAPSHOT, top_n=2)
    holders = analysis.at_snapshot
    assert len(holders.top) == 2
    assert holders.sites == 6
    assert holders.other_bytes == holders.total_live_bytes - sum(h.live_bytes for h in holders.top)
    assert holders.other_bytes > 0


@pytest.mark.parametrize(
    ("filename", "user"),
    [
        pytest.param("/home/u/proj/train.py", True, id="project"),
        pytest.param(
            "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
            False,
            id="torch-installed",
        ),
        pytest.param("/home/u/pytorch/torch/autograd/graph.py", False, id="torch-source-tree"),
        pytest.param(
            "/usr/lib/python3/dist-packages/accelerate/utils.py", False, id="dist-packages"
        ),
        pytest.param("/usr/lib/python3.11/runpy.py", False, id="stdlib"),
        pytest.param("<frozen runpy>", False, id="frozen"),
        pytest.param("??", False, id="cpp-unknown"),
        pytest.param("/pytorch/c10/cuda/CUDACachingAllocator.cpp", False, id="cpp"),
        pytest.param("<ipython-input-3-1a2b>", True, id="notebook-cell"),
        pytest.param("/home/u/proj/torchvision_utils.py", True, id="name-mentions-torch"),
    ],
)
def test_user_frames_are_the_programs_own_python(filename: str, user: bool) -> None:
    assert is_user_frame(Frame(filename, 1, "f")) is user


def test_a_stack_of_library_code_only_is_filed_under_its_innermost_python_frame() -> None:
    stack = (
        Frame("??", 0, "c10::cuda::malloc"),
        Frame("/x/site-packages/torch/nn/functional.py", 10, "linear"),
        Frame("/x/site-packages/transformers/trainer.py", 20, "train"),
    )
    assert site_of(stack) == stack[1]
    assert site_of(()) is None


# -- fragmentation --------------------------------------------------------------------------


def test_fragmentation_is_one_minus_largest_free_over_total_free() -> None:
    frag = _analyse().fragmentation
    (pool,) = frag.pools
    assert pool.name == "large pool, stream 0"
    assert (pool.free_bytes, pool.largest_free_bytes) == (72 * MiB, 24 * MiB)
    assert pool.fragmentation == pytest.approx(1 - 24 / 72)
    assert pool.inactive_split_bytes == 72 * MiB
    assert frag.total.reserved_bytes == 192 * MiB
    assert frag.request_pool == pool
    assert frag.fits_largest_free is False
    assert frag.fits_request_pool is False


def test_a_pool_with_nothing_free_has_no_fragmentation_number() -> None:
    raw = fragmented_snapshot()
    for seg in raw["segments"]:
        seg["blocks"] = seg["blocks"][:1]
        seg["total_size"] = seg["blocks"][0]["size"]
    analysis = analyse_snapshot(parse_snapshot(raw))
    assert analysis.fragmentation.total.fragmentation is None
    assert analysis.fragmentation.fits_largest_free is False


def test_private_pools_and_streams_are_reported_apart() -> None:
    raw = fragmented_snapshot(free_segment=True)
    raw["segments"][1]["stream"] = 7
    frag = analyse_snapshot(parse_snapshot(raw)).fragmentation
    assert [p.name for p in frag.pools] == [
        "large pool, stream 0",
        "large pool, stream 0, private pool 1.7",
        "large pool, stream 7",
    ]
    assert frag.total.largest_free_bytes == 64 * MiB
    assert frag.fits_largest_free is True  # the free segment is big enough, in another pool
    assert frag.fits_request_pool is False


def test_the_flexgen_oom_pools_are_almost_full() -> None:
    frag = analyse_snapshot_file(OOM_SNAPSHOT).fragmentation
    assert frag.total.free_bytes == 4_554_752
    assert frag.total.largest_free_bytes == 2_080_768
    assert frag.total.fragmentation == pytest.approx(1 - 2_080_768 / 4_554_752)
    assert frag.fits_largest_free is None  # no failed request was recorded


# -- what if --------------------------------------------------------------------------------


def _verdicts(analysis: SnapshotAnalysis) -> dict[str, bool | None]:
    return {w.change.split(" ")[0]: w.avoided for w in analysis.what_if}


def test_expandable_segments_would_have_avoided_an_oom_caused_by_holes() -> None:
    analysis = _analyse(request_bytes=50 * MiB)
    assert _verdicts(analysis) == {
        "expandable_segments:True": True,
        "torch.cuda.empty_cache()": False,
    }
    expandable = analysis.what_if[0]
    assert expandable.available_bytes == 70 * MiB  # three whole 20 MiB pages + 10 MiB CUDA had
    assert expandable.needed_bytes == 60 * MiB
    assert any("enough for the 50.0 MiB request" in r for r in expandable.reasons)
    empty_cache = analysis.what_if[1]
    assert any("No segment was entirely free" in r for r in empty_cache.reasons)


def test_no_allocator_setting_helps_when_live_tensors_fill_the_memory() -> None:
    analysis = _analyse(request_bytes=200 * MiB)
    assert _verdicts(analysis)["expandable_segments:True"] is False
    assert any("Live tensors held 120.0 MiB" in r for r in analysis.what_if[0].reasons)


def test_between_the_bounds_the_answer_is_honestly_unknown() -> None:
    analysis = _analyse(request_bytes=75 * MiB)  # 80 MiB of pages; 70 to 82 MiB to be had
    expandable = analysis.what_if[0]
    assert expandable.avoided is None
    assert expandable.verdict == "cannot tell"


def test_empty_cache_helps_when_a_whole_free_segment_would_go_back_to_cuda() -> None:
    analysis = _analyse(request_bytes=60 * MiB, free_segment=True)
    empty_cache = analysis.what_if[1]
    assert empty_cache.avoided is True
    assert empty_cache.available_bytes == 74 * MiB
    assert empty_cache.needed_bytes == 60 * MiB
    assert any("private pools" in r for r in empty_cache.reasons)


def test_expandable_segments_already_on_cannot_be_the_fix() -> None:
    analysis = _analyse(expandable_setting=True)
    assert analysis.expandable_segments is True
    assert analysis.what_if[0].avoided is False
    assert "already on" in analysis.what_if[0].reasons[0]


def test_without_a_recorded_request_the_flexgen_oom_says_what_can_be_known() -> None:
    analysis = analyse_snapshot_file(OOM_SNAPSHOT)
    for what_if in analysis.what_if:
        assert what_if.avoided is None
        assert "no failed request" in what_if.reasons[0]
    expandable, empty_cache = analysis.what_if
    assert "At most 4.3 MiB" in expandable.reasons[1]
    assert "At most 0 B" in empty_cache.reasons[1]
    assert any("Live tensors held 11.0 GiB" in r for r in expandable.reasons)


@pytest.mark.parametrize(
    ("requested", "block", "from_cuda"),
    [
        pytest.param(1, 512, 2 * MiB, id="tiny"),
        pytest.param(1 * MiB, 1 * MiB, 2 * MiB, id="small-pool-max"),
        pytest.param(1 * MiB + 1, 1 * MiB + 512, 20 * MiB, id="large-below-10MiB"),
        pytest.param(10 * MiB, 10 * MiB, 10 * MiB, id="10MiB"),
        pytest.param(11 * MiB + 3, 11 * MiB + 512, 12 * MiB, id="rounded-to-2MiB"),
    ],
)
def test_request_sizes_round_as_the_caching_allocator_rounds_them(
    requested: int, block: int, from_cuda: int
) -> None:
    assert round_size(requested) == block
    assert cuda_request_bytes(requested) == from_cuda


def test_the_device_with_the_oom_is_the_one_analysed() -> None:
    raw = fragmented_snapshot()
    other = copy.deepcopy(raw["segments"][0])
    other["device"] = 1
    other["total_size"] = other["blocks"][0]["size"] = 10 * 1024 * MiB
    other["blocks"] = other["blocks"][:1]
    raw["segments"].append(other)
    assert analyse_snapshot(parse_snapshot(raw)).device == 0
    assert analyse_snapshot(parse_snapshot(raw), device=1).reserved_bytes == 10 * 1024 * MiB
