"""PyTorch's CUDA side: the one call gate over `torch.cuda`, and the caching-allocator
counters read through it (current values, interval peaks, OOM statistics)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from memdoc.collectors.base import Values
from memdoc.collectors.frameworks import IntervalPeak
from memdoc.trace.model import Metric, SeriesKey, framework_metric

FRAMEWORK = "pytorch"


class CudaGate(Protocol):
    """The few torch.cuda calls memdoc makes; all but `is_built` and `is_initialized` are
    only made once the program has initialised CUDA."""

    def is_built(self) -> bool: ...

    def is_initialized(self) -> bool: ...

    def device_count(self) -> int: ...

    def current_device(self) -> int: ...

    def device(self, index: int) -> dict[str, Any]: ...

    def memory_stats(self, index: int) -> Mapping[str, Any]: ...

    def memory_fraction(self, index: int) -> float | None: ...

    def allocator_backend(self) -> str | None: ...

    def mem_get_info(self, index: int) -> tuple[int, int]: ...

    def attach_oom_observer(self, observer: Callable[[int, int, int, int], None]) -> None: ...

    def record_history(self, max_entries: int | None) -> None: ...

    def snapshot(self) -> Any: ...


class TorchCudaGate:
    """The real gate over `torch.cuda`, for a torch the program has already imported."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._cuda = torch.cuda

    def is_built(self) -> bool:
        return bool(self._torch.backends.cuda.is_built())

    def is_initialized(self) -> bool:
        return bool(self._cuda.is_initialized())

    def device_count(self) -> int:
        return int(self._cuda.device_count())

    def current_device(self) -> int:
        return int(self._cuda.current_device())

    def device(self, index: int) -> dict[str, Any]:
        props = self._cuda.get_device_properties(index)
        return {"index": index, "name": str(props.name), "total_bytes": int(props.total_memory)}

    def memory_stats(self, index: int) -> Mapping[str, Any]:
        # The nested form is what the C++ side builds; memory_allocated() and friends
        # build it too, then flatten it: one nested read is the cheapest way to every counter.
        stats: Mapping[str, Any] = self._cuda.memory_stats_as_nested_dict(index)
        return stats

    def memory_fraction(self, index: int) -> float | None:
        getter = getattr(self._cuda, "get_per_process_memory_fraction", None)
        return float(getter(index)) if getter is not None else None

    def allocator_backend(self) -> str | None:
        getter = getattr(self._cuda, "get_allocator_backend", None)
        return str(getter()) if getter is not None else None

    def mem_get_info(self, index: int) -> tuple[int, int]:
        free, total = self._cuda.mem_get_info(index)
        return int(free), int(total)

    def attach_oom_observer(self, observer: Callable[[int, int, int, int], None]) -> None:
        self._torch._C._cuda_attach_out_of_memory_observer(observer)

    def record_history(self, max_entries: int | None) -> None:
        record = self._cuda.memory._record_memory_history
        if max_entries is None:
            record(enabled=None)
        else:
            record(enabled="all", context="all", stacks="python", max_entries=max_entries)

    def snapshot(self) -> Any:
        return self._cuda.memory._snapshot()


_real_gates: dict[int, TorchCudaGate] = {}


def device_memory(gate: CudaGate | None = None) -> dict[str, int]:
    """The live tensors' bytes on the program's current CUDA device now (`index`,
    `allocated_bytes`), read through the gate in one counter read; empty before the program
    has initialised CUDA, without torch, or where the read fails."""
    try:
        if gate is None:
            torch = sys.modules.get("torch")
            if torch is None:
                return {}
            gate = real_gate(torch)
        if not gate.is_built() or not gate.is_initialized():
            return {}
        index = gate.current_device()
        counters = cuda_counters(gate.memory_stats(index))
    except Exception:
        return {}
    return {"index": index, "allocated_bytes": counters.allocated_bytes} if counters else {}


def real_gate(torch: Any) -> TorchCudaGate:
    """The gate over this torch module, one per process: OOM observers attach to it once."""
    gate = _real_gates.get(id(torch))
    if gate is None:
        gate = _real_gates[id(torch)] = TorchCudaGate(torch)
    return gate


@dataclass(frozen=True)
class CudaCounters:
    """One device's caching-allocator counters; `*_peak_bytes` are all-time (since the
    program last reset them), not per interval."""

    allocated_bytes: int
    allocated_peak_bytes: int
    reserved_bytes: int
    reserved_peak_bytes: int
    active_bytes: int | None = None
    inactive_split_bytes: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    private_pool_bytes: int | None = None


def cuda_counters(stats: Mapping[str, Any]) -> CudaCounters | None:
    """Counters from `torch.cuda.memory_stats_as_nested_dict()`; None when it is empty
    (CUDA not initialised)."""
    allocated = _stat(stats, "allocated_bytes")
    reserved = _stat(stats, "reserved_bytes")
    if allocated is None or reserved is None:
        return None
    active = _stat(stats, "active_bytes")
    inactive = _stat(stats, "inactive_split_bytes")
    return CudaCounters(
        allocated_bytes=int(allocated["current"]),
        allocated_peak_bytes=int(allocated["peak"]),
        reserved_bytes=int(reserved["current"]),
        reserved_peak_bytes=int(reserved["peak"]),
        active_bytes=int(active["current"]) if active else None,
        inactive_split_bytes=int(inactive["current"]) if inactive else None,
        num_alloc_retries=_int_or_none(stats.get("num_alloc_retries")),
        num_ooms=_int_or_none(stats.get("num_ooms")),
        private_pool_bytes=_private_pool_bytes(stats.get("reserved_bytes_by_private_pools")),
    )


def _stat(stats: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    group = stats.get(name)
    if not isinstance(group, Mapping):
        return None
    pools = group.get("all")
    return pools if isinstance(pools, Mapping) and "current" in pools else None


def _private_pool_bytes(pools: Any) -> int | None:
    """Reserved bytes in private pools (CUDA graphs, MemPool); None when this PyTorch does
    not report them."""
    if not isinstance(pools, Mapping):
        return None
    total = 0
    for pool in pools.values():
        if isinstance(pool, Mapping) and isinstance(pool.get("all"), Mapping):
            total += int(pool["all"].get("current", 0))
    return total


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def counters_to_stats(counters: CudaCounters) -> dict[str, int]:
    """The `stats` of an OOM event: known counters only."""
    stats = {
        "allocated_bytes": counters.allocated_bytes,
        "allocated_peak_bytes": counters.allocated_peak_bytes,
        "reserved_bytes": counters.reserved_bytes,
        "reserved_peak_bytes": counters.reserved_peak_bytes,
        "active_bytes": counters.active_bytes,
        "inactive_split_bytes": counters.inactive_split_bytes,
        "num_alloc_retries": counters.num_alloc_retries,
        "num_ooms": counters.num_ooms,
        "private_pool_bytes": counters.private_pool_bytes,
    }
    return {key: value for key, value in stats.items() if value is not None}


def torch_oom_stats(device: int | None = None) -> dict[str, Any]:
    """Allocator statistics of a CUDA device now (the current device when None), for an OOM
    event; {} when the program has not imported torch or not initialised CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    gate = real_gate(torch)
    if not gate.is_initialized():
        return {}
    return device_oom_stats(gate, gate.current_device() if device is None else device)


def device_oom_stats(gate: CudaGate, index: int) -> dict[str, Any]:
    counters = cuda_counters(gate.memory_stats(index))
    stats: dict[str, Any] = {"device": index}
    if counters is not None:
        stats.update(counters_to_stats(counters))
    # The device may be unusable right after a failure; the counters are enough then.
    with contextlib.suppress(Exception):
        stats["free_bytes"], stats["total_bytes"] = gate.mem_get_info(index)
    fraction = gate.memory_fraction(index)
    if fraction is not None and fraction < 1.0:
        stats["memory_fraction"] = fraction
    return stats


class DeviceSeries:
    """Series keys and interval-peak state of one device, built once."""

    def __init__(self, index: int, pid: int) -> None:
        self.index = index

        def key(quantity: str) -> SeriesKey:
            return SeriesKey(framework_metric(FRAMEWORK, quantity), index, pid)

        self.allocated, self.allocated_peak = key(Metric.ALLOCATED), key(Metric.ALLOCATED_PEAK)
        self.reserved, self.reserved_peak = key(Metric.RESERVED), key(Metric.RESERVED_PEAK)
        self.active, self.inactive_split = key(Metric.ACTIVE), key(Metric.INACTIVE_SPLIT)
        self.retries, self.ooms = key(Metric.ALLOC_RETRIES), key(Metric.NUM_OOMS)
        self.private_pool = key(Metric.PRIVATE_POOL)
        self.allocated_peaks = IntervalPeak()
        self.reserved_peaks = IntervalPeak()

    def values(self, c: CudaCounters, out: Values) -> None:
        out[self.allocated] = c.allocated_bytes
        out[self.allocated_peak] = self.allocated_peaks.update(
            c.allocated_bytes, c.allocated_peak_bytes
        )
        out[self.reserved] = c.reserved_bytes
        out[self.reserved_peak] = self.reserved_peaks.update(
            c.reserved_bytes, c.reserved_peak_bytes
        )
        optional = (
            (self.active, c.active_bytes),
            (self.inactive_split, c.inactive_split_bytes),
            (self.retries, c.num_alloc_retries),
            (self.ooms, c.num_ooms),
            (self.private_pool, c.private_pool_bytes),
        )
        for key, value in optional:
            if value is not None:
                out[key] = value
