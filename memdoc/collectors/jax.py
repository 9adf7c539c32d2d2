"""JAX: per-device allocator statistics, or live-array accounting where the backend keeps
none (CPU), and at an OOM a live-array summary and a device memory profile."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memdoc.collectors.allocator_conf import jax_alloc_conf
from memdoc.collectors.base import CollectorFailed, SessionHandle, Values
from memdoc.collectors.frameworks import ArtifactDir, IntervalPeak, host_device_index
from memdoc.trace.model import CollectorStatus, EventKind, Metric, SeriesKey, framework_metric

FRAMEWORK = "jax"
_BRIDGE_MODULE = "jax._src.xla_bridge"
# Live-array scans run at most once a second and take at most ~1% of the time: a scan
# holds the GIL for about a microsecond per live array.
SCAN_MIN_INTERVAL_S = 1.0
SCAN_MAX_DUTY = 0.01
LAYOUT_CACHE_MAX = 4096
TOP_GROUPS = 10


def jax_device_index(device: Any) -> int:
    """The series index of a JAX device: the CUDA ordinal for a GPU, -1-id for a CPU device."""
    if device.platform == "cpu":
        return host_device_index(int(device.id))
    local = getattr(device, "local_hardware_id", None)
    return int(local) if local is not None else int(device.id)


class LiveArrayAccounting:
    """Bytes each device holds for live arrays, from shapes, dtypes and shardings alone
    (touching shards would create new arrays). Layouts are cached per sharding and shape."""

    def __init__(self) -> None:
        self._layouts: dict[tuple[Any, ...], tuple[tuple[Any, int], ...]] = {}

    def per_device(self, arrays: Iterable[Any]) -> dict[Any, int]:
        totals: dict[Any, int] = {}
        for array in arrays:
            for device, nbytes in self.layout(array):
                totals[device] = totals.get(device, 0) + nbytes
        return totals

    def layout(self, array: Any) -> tuple[tuple[Any, int], ...]:
        """(device, bytes) for each device holding a shard of `array`; replicas count on
        every device that holds one."""
        sharding, shape, dtype = array.sharding, array.shape, array.dtype
        key = (sharding, shape, dtype)
        cached = self._layouts.get(key)
        if cached is None:
            shard_bytes = int(dtype.itemsize)
            for size in sharding.shard_shape(shape):
                shard_bytes *= int(size)
            cached = tuple((d, shard_bytes) for d in sharding.addressable_devices)
            if len(self._layouts) >= LAYOUT_CACHE_MAX:
                self._layouts.clear()
            self._layouts[key] = cached
        return cached


def live_array_summary(top: int = TOP_GROUPS) -> dict[str, Any]:
    """What the program's live JAX arrays hold: count, bytes (on all devices together), bytes
    per device index, and the largest groups by shape and dtype. {} without JAX."""
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    arrays = jax.live_arrays()
    accounting = LiveArrayAccounting()
    by_device: dict[int, int] = {}
    groups: dict[tuple[tuple[int, ...], str], list[int]] = {}
    for array in arrays:
        held = 0
        for device, nbytes in accounting.layout(array):
            index = jax_device_index(device)
            by_device[index] = by_device.get(index, 0) + nbytes
            held += nbytes
        group = groups.setdefault((tuple(int(s) for s in array.shape), str(array.dtype)), [0, 0])
        group[0] += 1
        group[1] += held
    largest = sorted(groups.items(), key=lambda item: item[1][1], reverse=True)[:top]
    return {
        "count": len(arrays),
        "bytes": sum(by_device.values()),
        "by_device": {str(k): v for k, v in sorted(by_device.items())},
        "groups": [
            {"shape": list(shape), "dtype": dtype, "count": count, "bytes": nbytes}
            for (shape, dtype), (count, nbytes) in largest
        ],
    }


@dataclass
class _JaxDevice:
    """One device: the JAX object, its series keys and peak state."""

    device: Any
    index: int
    keys: dict[str, SeriesKey]
    has_stats: bool
    allocated_peaks: IntervalPeak = field(default_factory=IntervalPeak)
    reserved_peaks: IntervalPeak = field(default_factory=IntervalPeak)


# memory_stats() key -> metric; peaks come from their all-time counterparts below.
_STAT_METRICS = (
    ("bytes_in_use", Metric.ALLOCATED),
    ("pool_bytes", Metric.RESERVED),
    ("bytes_limit", Metric.LIMIT),
    ("largest_free_block_bytes", Metric.LARGEST_FREE),
)


class JaxCollector:
    """Waits for the program to start a JAX backend (`jax.devices()` and any first op do):
    starting one early would pre-allocate GPU memory or override `jax_platforms`."""

    name = FRAMEWORK

    def __init__(
        self, *, files: ArtifactDir | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self._jax: Any = sys.modules.get("jax")
        self._files = files if files is not None else ArtifactDir()
        self._environ = environ if environ is not None else os.environ
        self._pid = os.getpid()
        self._session: SessionHandle | None = None
        self._devices: list[_JaxDevice] | None = None
        self._accounting = LiveArrayAccounting()
        self._next_scan_t = 0.0
        self.last_scan_s = 0.0

    def probe(self) -> CollectorStatus:
        version = getattr(self._jax, "__version__", None)
        return CollectorStatus(name=FRAMEWORK, available=True, version=str(version))

    def start(self, session: SessionHandle) -> None:
        # The framework is named once the program starts a JAX backend, not on import:
        # another framework may import JAX for its own use (TensorFlow with Keras 3 does),
        # and a program that never runs JAX must not get JAX's findings and fixes.
        self._session = session

    def sample(self, unix_t: float) -> Values:
        if self._devices is None:
            if not self._backend_started():
                return {}
            self._on_backend_started()
        assert self._devices is not None
        values: Values = {}
        try:
            for device in self._devices:
                if device.has_stats:
                    self._stat_values(device, values)
            if unix_t >= self._next_scan_t and any(not d.has_stats for d in self._devices):
                self._scan_values(unix_t, values)
        except Exception as exc:
            raise CollectorFailed(
                f"JAX memory statistics stopped working: {exc!r}",
                "the rest of the trace (host, NVML) is still recorded",
            ) from None
        return values

    def close(self) -> None:
        return None  # nothing was attached to JAX

    def oom_context(self, exc: BaseException) -> Mapping[str, Any] | None:
        if not _is_jax_oom(exc) or self._devices is None:
            return None
        context: dict[str, Any] = {}
        stats = {}
        for device in self._devices:
            if device.has_stats:
                stats[str(device.index)] = dict(device.device.memory_stats() or {})
        if stats:
            context["stats"] = stats
        context["live_arrays"] = live_array_summary()
        from memdoc.collectors.loops.jax import (
            compiled_memory,
            jitted_call,
            optimizer_state_bytes,
        )

        called = jitted_call(exc)
        if called is not None:  # "": no jitted function of the program was on the way
            context["jitted_call"] = called
        planned = compiled_memory(exc) if called else None
        if planned is not None:
            context["compiled_memory"] = planned
        state = optimizer_state_bytes(exc) if called else None
        if state is not None:
            context["optimizer_state_bytes"] = state
        profile = self._save_memory_profile()
        if profile is not None:
            context["memory_profile"] = profile
        return context

    def on_mark(self, label: str, data: Mapping[str, Any]) -> None:
        return None

    # -- sampling -------------------------------------------------------------------------

    def _stat_values(self, device: _JaxDevice, values: Values) -> None:
        stats = device.device.memory_stats()
        if not stats:
            return
        for stat, metric in _STAT_METRICS:
            if stat in stats:
                values[device.keys[metric]] = int(stats[stat])
        if "bytes_in_use" in stats:
            peak = device.allocated_peaks.update(
                int(stats["bytes_in_use"]), _optional_int(stats.get("peak_bytes_in_use"))
            )
            values[device.keys[Metric.ALLOCATED_PEAK]] = peak
        if "pool_bytes" in stats:
            peak = device.reserved_peaks.update(
                int(stats["pool_bytes"]), _optional_int(stats.get("peak_pool_bytes"))
            )
            values[device.keys[Metric.RESERVED_PEAK]] = peak

    def _scan_values(self, unix_t: float, values: Values) -> None:
        """Live-array bytes of the devices without allocator statistics. No interval peak:
        a scan sees only the arrays alive at that instant."""
        assert self._devices is not None
        started = time.perf_counter()
        totals = self._accounting.per_device(self._jax.live_arrays())
        for device in self._devices:
            if not device.has_stats:
                values[device.keys[Metric.ALLOCATED]] = totals.get(device.device, 0)
        self.last_scan_s = time.perf_counter() - started
        self._next_scan_t = unix_t + max(SCAN_MIN_INTERVAL_S, self.last_scan_s / SCAN_MAX_DUTY)

    # -- the backend ----------------------------------------------------------------------

    def _backend_started(self) -> bool:
        bridge = sys.modules.get(_BRIDGE_MODULE)
        started = getattr(bridge, "backends_are_initialized", None)
        return bool(started()) if started is not None else False

    def _on_backend_started(self) -> None:
        devices = []
        for jax_device in self._jax.local_devices():
            index = jax_device_index(jax_device)
            keys = {
                metric: SeriesKey(framework_metric(FRAMEWORK, metric), index, self._pid)
                for metric in (*(m for _, m in _STAT_METRICS), Metric.ALLOCATED_PEAK)
            }
            keys[Metric.RESERVED_PEAK] = SeriesKey(
                framework_metric(FRAMEWORK, Metric.RESERVED_PEAK), index, self._pid
            )
            has_stats = bool(jax_device.memory_stats())
            devices.append(_JaxDevice(jax_device, index, keys, has_stats))
        self._devices = devices
        if self._session is not None:
            described = [
                {
                    "index": d.index,
                    "name": str(d.device),
                    "kind": str(d.device.platform),
                    "memory_stats": d.has_stats,
                }
                for d in devices
            ]
            self._session.emit(EventKind.FRAMEWORK, self._framework_data(described))
            conf = jax_alloc_conf(self._environ)
            conf["platform"] = str(self._jax.default_backend())
            self._session.emit(EventKind.ALLOCATOR_CONFIG, conf)

    def _save_memory_profile(self) -> str | None:
        """The pprof device memory profile, beside the trace; None when it cannot be taken."""
        try:
            profile = self._jax.profiler.device_memory_profile()
            path = self._files.write("memdoc-jax-memory", ".prof", profile)
        except Exception:
            return None
        if self._session is not None:
            self._session.emit(
                EventKind.SNAPSHOT,
                {"path": path, "reason": "oom", "framework": FRAMEWORK, "format": "pprof"},
            )
        return path

    def _framework_data(self, devices: list[dict[str, Any]]) -> dict[str, Any]:
        version = getattr(self._jax, "__version__", None)
        return {"name": FRAMEWORK, "version": str(version), "devices": devices}


def _is_jax_oom(exc: BaseException) -> bool:
    """A JAX/XLA runtime error (JaxRuntimeError, XlaRuntimeError) that is a memory error:
    RESOURCE_EXHAUSTED on accelerators, "INTERNAL: ... Out of memory allocating" on CPU."""
    module = type(exc).__module__.split(".")[0]
    head = str(exc)[:2000]
    return module in ("jax", "jaxlib") and (
        "RESOURCE_EXHAUSTED" in head or "out of memory" in head.lower()
    )


def _optional_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None
