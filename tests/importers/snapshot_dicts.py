"""Real files recorded by others, and snapshot dicts built the way PyTorch's
`torch.cuda.memory._snapshot()` docstring documents them (2.1 and later)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures" / "importers"
FLEXGEN = FIXTURES / "torch-snapshots-flexgen"
OOM_SNAPSHOT = FLEXGEN / "oom_snapshot.pickle"
OPT_SNAPSHOT = FLEXGEN / "1.3b_snapshot.pickle"
HTA = FIXTURES / "torch-profiler-hta"
SMI_XML = FIXTURES / "nvidia-smi-xml"
SMI_CAPTURES = FIXTURES / "nvidia-smi-captures"
XPLANE = FIXTURES / "tf-profiler-xplane" / "34.83.195.179_6003.xplane.pb"

MiB = 1024**2
T0_US = 1_764_000_000_000_000  # 2025-11-24, in microseconds

TRAIN = [
    {"filename": "/home/u/proj/model.py", "line": 40, "name": "forward"},
    {"filename": "/home/u/proj/train.py", "line": 12, "name": "main"},
]
ATTENTION = [
    {
        "filename": "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py",
        "line": 5000,
        "name": "softmax",
    },
    {"filename": "/home/u/proj/model.py", "line": 77, "name": "attention"},
    {"filename": "/home/u/proj/train.py", "line": 12, "name": "main"},
]
FAILING = [
    {"filename": "/home/u/proj/model.py", "line": 90, "name": "logits"},
    {"filename": "/home/u/proj/train.py", "line": 12, "name": "main"},
]


def block(
    address: int,
    size: int,
    state: str,
    frames: list[dict[str, Any]] | None = None,
    requested: int | None = None,
) -> dict[str, Any]:
    return {
        "address": address,
        "size": size,
        "requested_size": requested if requested is not None else size,
        "state": state,
        "frames": frames or [],
    }


def segment(
    address: int,
    blocks: list[dict[str, Any]],
    *,
    stream: int = 0,
    segment_type: str = "large",
    pool: tuple[int, int] = (0, 0),
    expandable: bool = False,
    device: int = 0,
) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": device,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": sum(
            b["requested_size"] for b in blocks if b["state"] == "active_allocated"
        ),
        "stream": stream,
        "segment_type": segment_type,
        "segment_pool_id": pool,
        "is_expandable": expandable,
        "frames": [],
        "blocks": blocks,
    }


def entry(
    action: str,
    size: int,
    t_us: int | None,
    *,
    addr: int | None = None,
    frames: list[dict[str, Any]] | None = None,
    device_free: int | None = None,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "action": action,
        "size": size,
        "stream": 0,
        "frames": frames or [],
        "compile_context": "N/A",
        "user_metadata": "",
        "pool_id": (0, 0),
    }
    if action == "oom":
        e["device_free"] = device_free
    else:
        e["addr"] = addr
    if t_us is not None:
        e["time_us"] = t_us
    return e


def fragmented_snapshot(
    *,
    request_bytes: int = 50 * MiB,
    device_free: int = 10 * MiB,
    times: bool = True,
    free_segment: bool = False,
    expandable_setting: bool = False,
) -> dict[str, Any]:
    """Three 64 MiB segments, each a live 40 MiB weight then a 24 MiB hole left by a freed
    temporary: 72 MiB cached free, none of it in one piece of more than 24 MiB. The trace
    records it all, then a failed request."""
    base = 0x7F00_0000_0000
    segments = []
    trace = []
    t = T0_US
    for i in range(3):
        seg = base + i * 64 * MiB
        segments.append(
            segment(
                seg,
                [
                    block(seg, 40 * MiB, "active_allocated", TRAIN),
                    block(seg + 40 * MiB, 24 * MiB, "inactive"),
                ],
            )
        )
        trace.append(entry("segment_alloc", 64 * MiB, t, addr=seg))
        trace.append(entry("alloc", 40 * MiB, t + 1000, addr=seg, frames=TRAIN))
        trace.append(entry("alloc", 24 * MiB, t + 2000, addr=seg + 40 * MiB, frames=ATTENTION))
        t += 10_000
    for i in range(3):
        addr = base + i * 64 * MiB + 40 * MiB
        trace.append(entry("free_requested", 24 * MiB, t, addr=addr, frames=ATTENTION))
        trace.append(entry("free_completed", 24 * MiB, t + 10, addr=addr, frames=ATTENTION))
        t += 5_000
    if free_segment:
        seg = base + 10 * 64 * MiB
        segments.append(segment(seg, [block(seg, 64 * MiB, "inactive")], pool=(1, 7)))
        trace.append(entry("segment_alloc", 64 * MiB, t, addr=seg))
        t += 1000
    trace.append(entry("oom", request_bytes, t, frames=FAILING, device_free=device_free))
    if not times:
        for e in trace:
            e.pop("time_us", None)
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if expandable_setting else "",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": expandable_setting,
        "roundup_power2_divisions": {"1": 0},
    }
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": settings,
        "external_annotations": [],
    }


def write_pickle(path: Path, data: Any, protocol: int = 4) -> Path:
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path
