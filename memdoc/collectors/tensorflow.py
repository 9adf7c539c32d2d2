"""TensorFlow: per-device allocator usage from `get_memory_info`, once the program's runtime
is up, with the memory-growth and allocator settings it started with."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memdoc.collectors.allocator_conf import tf_alloc_conf, tf_cpu_bfc_enabled
from memdoc.collectors.base import CollectorFailed, SessionHandle, Values
from memdoc.collectors.frameworks import IntervalPeak, host_device_index
from memdoc.trace.model import CollectorStatus, EventKind, Metric, SeriesKey, framework_metric

FRAMEWORK = "tensorflow"
MIB = 1 << 20
LIMIT_INTERVAL_S = 5.0
_CONTEXT_MODULE = "tensorflow.python.eager.context"


@dataclass
class _TfDevice:
    """One logical device memdoc reads: its TF name ("GPU:0"), series index and keys."""

    tf_name: str
    index: int
    limit_bytes: int | None
    allocated: SeriesKey
    allocated_peak: SeriesKey
    limit: SeriesKey
    peaks: IntervalPeak = field(default_factory=IntervalPeak)


class TensorFlowCollector:
    """Reads nothing until the program's own first op (or device setup) has initialised
    TensorFlow's runtime: `get_memory_info` would initialise it, which maps most of every
    GPU and freezes the memory-growth setting the program may still be about to make."""

    name = FRAMEWORK

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._tf: Any = sys.modules.get("tensorflow")
        self._environ = environ if environ is not None else os.environ
        self._session: SessionHandle | None = None
        self._pid = os.getpid()
        self._devices: list[_TfDevice] | None = None
        self._next_limit_t = 0.0

    def probe(self) -> CollectorStatus:
        version = getattr(self._tf, "__version__", None)
        return CollectorStatus(name=FRAMEWORK, available=True, version=str(version))

    def start(self, session: SessionHandle) -> None:
        self._session = session
        session.emit(EventKind.FRAMEWORK, self._framework_data([]))

    def sample(self, unix_t: float) -> Values:
        if self._devices is None:
            if not self._runtime_started():
                return {}
            self._on_runtime_started()
        assert self._devices is not None
        values: Values = {}
        try:
            for device in self._devices:
                info = self._tf.config.experimental.get_memory_info(device.tf_name)
                current = int(info["current"])
                values[device.allocated] = current
                values[device.allocated_peak] = device.peaks.update(current, int(info["peak"]))
                if device.limit_bytes is not None and unix_t >= self._next_limit_t:
                    values[device.limit] = device.limit_bytes
        except Exception as exc:
            raise CollectorFailed(
                f"TensorFlow memory statistics stopped working: {exc!r}",
                "the rest of the trace (host, NVML) is still recorded",
            ) from None
        if unix_t >= self._next_limit_t:
            self._next_limit_t = unix_t + LIMIT_INTERVAL_S
        return values

    def close(self) -> None:
        return None  # nothing was attached to TensorFlow

    def oom_context(self, exc: BaseException) -> Mapping[str, Any] | None:
        errors = getattr(self._tf, "errors", None)
        exhausted = getattr(errors, "ResourceExhaustedError", None)
        if not (isinstance(exhausted, type) and isinstance(exc, exhausted)):
            return None
        stats: dict[str, Any] = {}
        for device in self._devices or []:
            try:
                info = self._tf.config.experimental.get_memory_info(device.tf_name)
            except Exception:
                continue
            entry = {"allocated_bytes": int(info["current"]), "peak_bytes": int(info["peak"])}
            if device.limit_bytes is not None:
                entry["limit_bytes"] = device.limit_bytes
            stats[str(device.index)] = entry
        return {"stats": stats} if stats else None

    def on_mark(self, label: str, data: Mapping[str, Any]) -> None:
        return None

    # -- the runtime ----------------------------------------------------------------------

    def _runtime_started(self) -> bool:
        module = sys.modules.get(_CONTEXT_MODULE)
        context = module.context_safe() if module is not None else None
        return bool(getattr(context, "_initialized", False))

    def _on_runtime_started(self) -> None:
        config = self._tf.config
        devices: list[_TfDevice] = []
        described: list[dict[str, Any]] = []
        limits = self._logical_limits()
        # With virtual devices (several logical GPUs on one card) the index is the logical one.
        for logical in config.list_logical_devices():
            kind, _, number = str(logical.name).rpartition("/device:")[2].partition(":")
            ordinal = int(number) if number.isdigit() else 0
            if kind == "GPU":
                index, limit = ordinal, limits.get(ordinal)
            elif kind == "CPU" and tf_cpu_bfc_enabled(self._environ):
                # Only the BFC allocator counts CPU memory; the default one answers zeros.
                index, limit = host_device_index(ordinal), self._cpu_limit()
            else:
                described.append({"name": f"{kind}:{ordinal}", "kind": kind.lower()})
                continue
            name = f"{kind}:{ordinal}"
            tracked = self._tracks_memory(name)
            if tracked:
                devices.append(self._device(name, index, limit))
            described.append(
                {"index": index, "name": name, "kind": kind.lower(), "memory_stats": tracked}
            )
        self._devices = devices
        if self._session is not None:
            self._session.emit(EventKind.FRAMEWORK, self._framework_data(described))
            self._session.emit(EventKind.ALLOCATOR_CONFIG, self._allocator_config(limits))

    def _tracks_memory(self, tf_name: str) -> bool:
        """Whether TensorFlow keeps statistics for this device (some allocators do not)."""
        try:
            self._tf.config.experimental.get_memory_info(tf_name)
        except Exception:
            return False
        return True

    def _device(self, tf_name: str, index: int, limit_bytes: int | None) -> _TfDevice:
        def key(quantity: str) -> SeriesKey:
            return SeriesKey(framework_metric(FRAMEWORK, quantity), index, self._pid)

        return _TfDevice(
            tf_name=tf_name,
            index=index,
            limit_bytes=limit_bytes,
            allocated=key(Metric.ALLOCATED),
            allocated_peak=key(Metric.ALLOCATED_PEAK),
            limit=key(Metric.LIMIT),
        )

    def _logical_limits(self) -> dict[int, int]:
        """Memory limits the program configured for GPUs (a logical device configuration
        with `memory_limit`, in MB), by GPU ordinal; several logical devices on one GPU add."""
        limits: dict[int, int] = {}
        for ordinal, physical in enumerate(self._tf.config.list_physical_devices("GPU")):
            configs = self._tf.config.get_logical_device_configuration(physical) or []
            total = sum(int(c.memory_limit or 0) for c in configs)
            if total:
                limits[ordinal] = total * MIB
        return limits

    def _cpu_limit(self) -> int | None:
        return tf_alloc_conf(self._environ).get("cpu_memory_limit_bytes")

    def _allocator_config(self, limits: dict[int, int]) -> dict[str, Any]:
        conf = tf_alloc_conf(self._environ)
        growth: dict[str, bool] = {}
        for ordinal, physical in enumerate(self._tf.config.list_physical_devices("GPU")):
            growth[str(ordinal)] = bool(self._tf.config.experimental.get_memory_growth(physical))
        if growth:
            conf["allow_growth_by_device"] = growth
            # TF_FORCE_GPU_ALLOW_GROWTH, when set, overrides what the program configured.
            conf.setdefault("allow_growth", all(growth.values()))
        if limits:
            conf["memory_limit_bytes"] = min(limits.values())
            conf["memory_limit_bytes_by_device"] = {str(k): v for k, v in limits.items()}
        return conf

    def _framework_data(self, devices: list[dict[str, Any]]) -> dict[str, Any]:
        version = getattr(self._tf, "__version__", None)
        return {"name": FRAMEWORK, "version": str(version), "devices": devices}
