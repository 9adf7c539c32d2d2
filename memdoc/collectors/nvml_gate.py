"""The one NVML call gate: every driver call goes through here and comes back as plain data."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from memdoc.collectors.devices import NVIDIA_SIGNS, present
from memdoc.trace.model import DeviceInfo

# NVML's "value not available" sentinel for per-process memory (2^64 - 1).
NOT_AVAILABLE = (1 << 64) - 1

NO_DRIVER_REASON = "NVML not found: no NVIDIA driver on this machine; showing host memory only"
NO_DRIVER_HINT = "on a GPU machine, check that `nvidia-smi` works and that the driver is loaded"


@dataclass(frozen=True)
class GpuMemory:
    """nvmlDeviceGetMemoryInfo: `used` includes what the driver keeps (`reserved`, v2 only)."""

    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    """One running compute process on a device; `used_bytes` is None when NVML cannot tell
    (Windows WDDM, some MIG setups, containers without permission)."""

    pid: int
    used_bytes: int | None


class NvmlUnavailable(Exception):
    """NVML cannot be used here; `reason` and `hint` are shown to the user once."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


class NvmlGate(Protocol):
    """What memdoc asks of NVML. Physical devices come first, then MIG instances
    (with `parent_index` set), numbered on from the last physical index."""

    def driver_version(self) -> str | None: ...

    def devices(self) -> list[DeviceInfo]: ...

    def memory(self, index: int) -> GpuMemory: ...

    def processes(self, index: int) -> list[GpuProcess]: ...

    def close(self) -> None: ...


# Errors that mean NVML itself is gone, not that one value was refused.
_FATAL_ERRORS = (
    "NVMLError_GpuIsLost",
    "NVMLError_Uninitialized",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibraryNotFound",
    "NVMLError_LibRmVersionMismatch",
    "NVMLError_ResetRequired",
)


def refused_value(exc: BaseException) -> str | None:
    """NVML's reason when it refused one value (no permission, not supported on this device:
    MIG instances, containers) and the other values can still be read; None when the error
    is not such a refusal (NVML itself is gone, or the error is not NVML's)."""
    try:
        import pynvml
    except ImportError:
        return None
    if not isinstance(exc, pynvml.NVMLError):
        return None
    fatal = tuple(getattr(pynvml, name) for name in _FATAL_ERRORS if hasattr(pynvml, name))
    if isinstance(exc, fatal):
        return None
    return str(exc) or type(exc).__name__


def open_gate() -> NvmlGate:
    """The real, pynvml-backed gate.

    Raises:
        NvmlUnavailable: no NVIDIA driver or library (every machine without a GPU), or no
            permission to query it.
    """
    return _PynvmlGate()


class _PynvmlGate:
    """The gate over nvidia-ml-py. Handles are looked up once; MIG instances are enumerated."""

    def __init__(self) -> None:
        if not present(NVIDIA_SIGNS):  # no driver: nvidia-ml-py would only say so, slower
            raise NvmlUnavailable(NO_DRIVER_REASON, NO_DRIVER_HINT)
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py is a dependency; this is a broken install
            raise NvmlUnavailable(f"nvidia-ml-py is not importable: {exc}") from None
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _unavailable(pynvml, exc) from None
        self._handles: list[Any] = []
        self._devices: list[DeviceInfo] = []
        try:
            self._enumerate()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML failed to list devices: {exc}") from None

    def _enumerate(self) -> None:
        nvml = self._nvml
        driver = self.driver_version()
        physical = nvml.nvmlDeviceGetCount()
        migs: list[tuple[int, Any]] = []
        for i in range(physical):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            self._handles.append(handle)
            self._devices.append(self._info(i, handle, driver, parent=None))
            migs.extend((i, h) for h in self._mig_handles(handle))
        for parent, handle in migs:
            index = len(self._handles)
            self._handles.append(handle)
            self._devices.append(self._info(index, handle, driver, parent=parent))

    def _mig_handles(self, handle: Any) -> list[Any]:
        nvml = self._nvml
        try:
            current, _ = nvml.nvmlDeviceGetMigMode(handle)
            if current != nvml.NVML_DEVICE_MIG_ENABLE:
                return []
            count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nvml.NVMLError:
            return []
        handles = []
        for j in range(count):
            try:
                handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))
            except nvml.NVMLError:
                continue  # an empty MIG slot
        return handles

    def _info(self, index: int, handle: Any, driver: str | None, parent: int | None) -> DeviceInfo:
        nvml = self._nvml
        name = _text(nvml.nvmlDeviceGetName(handle))
        try:
            uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError:
            uuid = None
        total = nvml.nvmlDeviceGetMemoryInfo(handle).total
        return DeviceInfo(
            index=index,
            name=name,
            total_bytes=int(total),
            uuid=uuid,
            parent_index=parent,
            driver_version=driver,
        )

    def driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return None

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def memory(self, index: int) -> GpuMemory:
        nvml = self._nvml
        handle = self._handles[index]
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            reserved = int(info.reserved)
        except (nvml.NVMLError, AttributeError, TypeError):
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            reserved = None
        return GpuMemory(int(info.total), int(info.used), int(info.free), reserved)

    def processes(self, index: int) -> list[GpuProcess]:
        nvml = self._nvml
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[index])
        out = []
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            out.append(
                GpuProcess(int(proc.pid), None if used in (None, NOT_AVAILABLE) else int(used))
            )
        return out

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _unavailable(nvml: Any, exc: Exception) -> NvmlUnavailable:
    if isinstance(exc, (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded)):
        return NvmlUnavailable(NO_DRIVER_REASON, NO_DRIVER_HINT)
    if isinstance(exc, nvml.NVMLError_NoPermission):
        return NvmlUnavailable(
            "NVML refused access (no permission); showing host memory only",
            "in a container, run it with the NVIDIA runtime (--gpus all)",
        )
    return NvmlUnavailable(f"NVML failed to start: {exc}; showing host memory only", NO_DRIVER_HINT)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
