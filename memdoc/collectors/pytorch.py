"""PyTorch: CUDA caching-allocator counters, optimizer steps, model state and OOM capture."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memdoc.collectors.allocator_conf import parse_bool, torch_alloc_conf
from memdoc.collectors.autograd import watch as backward_watch
from memdoc.collectors.base import SessionHandle, Values
from memdoc.collectors.frameworks import ArtifactDir
from memdoc.collectors.torch_cuda import (
    FRAMEWORK,
    CudaGate,
    DeviceSeries,
    cuda_counters,
    device_oom_stats,
    real_gate,
    torch_oom_stats,
)
from memdoc.kinds import OomKind
from memdoc.trace.model import CollectorStatus, EventKind, OomInfo

__all__ = ["CUDA_STATUS_NAME", "TorchCollector", "model_state_events", "torch_oom_stats"]

CUDA_STATUS_NAME = "pytorch.cuda"
RECORD_ENV = "MEMDOC_RECORD_ALLOCATIONS"
HISTORY_MAX_ENTRIES = 100_000
SLOW_INTERVAL_S = 1.0
# An OOM seen by the allocator's observer that no uncaught exception claims within this
# time was caught by the program (a batch-size finder, say) and is recorded as handled.
OOM_CLAIM_WINDOW_S = 1.0

NO_CUDA_BUILD = "PyTorch has no CUDA device here: this build has no CUDA support"
NOT_INITIALISED = "CUDA not initialised yet: memdoc waits for the program to use it"
NOT_INITIALISED_HINT = "memdoc never initialises CUDA itself (a context costs hundreds of MB)"


@dataclass
class _ObservedOom:
    t: float
    device: int
    requested_bytes: int
    limit_or_total_bytes: int
    free_bytes: int
    stats: dict[str, Any]


class _OomObserverRelay:
    """The allocator's OOM observers cannot be detached: memdoc attaches one per allocator
    (per gate) and relays to whichever collector is current."""

    def __init__(self) -> None:
        self._gates: weakref.WeakSet[Any] = weakref.WeakSet()
        self.target: weakref.ref[TorchCollector] | None = None

    def attach(self, gate: CudaGate, collector: TorchCollector) -> None:
        self.target = weakref.ref(collector)
        if gate not in self._gates:
            gate.attach_oom_observer(self)
            self._gates.add(gate)

    def detach(self, collector: TorchCollector) -> None:
        if self.target is not None and self.target() is collector:
            self.target = None

    def __call__(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        target = self.target() if self.target is not None else None
        if target is not None:
            target.observe_oom(device, alloc, device_allocated, device_free)


_relay = _OomObserverRelay()
_GPU_IN_MESSAGE = re.compile(r"\bGPU (\d+)")


class TorchCollector:
    """Steps from the global optimizer hook on any machine; CUDA counters once the program
    has initialised CUDA (re-checked each tick, never triggered by memdoc)."""

    name = FRAMEWORK

    def __init__(
        self,
        *,
        gate: CudaGate | None = None,
        files: ArtifactDir | None = None,
        record_allocations: bool | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._torch: Any = sys.modules.get("torch")
        self._gate = gate if gate is not None else real_gate(self._torch)
        self._files = files if files is not None else ArtifactDir()
        self._environ = environ if environ is not None else os.environ
        if record_allocations is None:
            record_allocations = parse_bool(self._environ.get(RECORD_ENV)) is True
        self.record_allocations = record_allocations
        self._pid = self._owner_pid = os.getpid()
        self._session: SessionHandle | None = None
        self._hook: Any = None
        self._backward = False  # watching backward passes for retain_graph
        self._primary: weakref.ref[Any] | None = None
        self._rival: weakref.ref[Any] | None = None
        self._cuda_ready = False
        self._cuda_off = False
        self._recording = False
        self._devices: dict[int, DeviceSeries] = {}
        self._next_slow_t = 0.0
        self._fractions: dict[int, float] = {}
        self._lock = threading.Lock()
        self._observed: list[_ObservedOom] = []

    # -- Collector ------------------------------------------------------------------------

    def probe(self) -> CollectorStatus:
        version = getattr(self._torch, "__version__", None)
        return CollectorStatus(name=FRAMEWORK, available=True, version=str(version))

    def start(self, session: SessionHandle) -> None:
        self._session = session
        self._hook = self._register_step_hook()
        self._backward = backward_watch.attach(self._torch, session)
        if self._hook is None:
            note = "no automatic steps: this PyTorch has no global optimizer step hook (2.0+)"
            session.emit(EventKind.NOTE, {"text": note})
        session.emit(EventKind.FRAMEWORK, self._framework_data([]))
        # The allocator configuration is recorded when CUDA starts (then it is fixed, and the
        # backend and fractions can be read); the header keeps the raw variable anyway.
        if not self._gate.is_built():
            session.collector(CollectorStatus(CUDA_STATUS_NAME, False, reason=NO_CUDA_BUILD))
        elif not self._gate.is_initialized():
            session.collector(
                CollectorStatus(
                    CUDA_STATUS_NAME, False, reason=NOT_INITIALISED, hint=NOT_INITIALISED_HINT
                )
            )

    def sample(self, unix_t: float) -> Values:
        if not self._cuda_ready:
            if self._cuda_off or not self._gate.is_initialized():
                return {}
            self._on_cuda_initialised()
        values: Values = {}
        try:
            if unix_t >= self._next_slow_t:
                self._slow_tick(unix_t)
            for device in self._devices.values():
                counters = cuda_counters(self._gate.memory_stats(device.index))
                if counters is not None:
                    device.values(counters, values)
        except Exception as exc:
            # Steps still come from the optimizer hook: drop only the CUDA part.
            self._cuda_failed(f"reading CUDA allocator statistics failed: {exc!r}")
        self._emit_unclaimed_ooms(unix_t)
        return values

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._backward and self._session is not None:
            backward_watch.detach(self._session)
            self._backward = False
        _relay.detach(self)
        self._emit_unclaimed_ooms(None)
        if self._recording:
            self._save_snapshot("end")
            with contextlib.suppress(Exception):
                self._gate.record_history(None)
            self._recording = False

    # -- hooks the session calls -----------------------------------------------------------

    def oom_context(self, exc: BaseException) -> Mapping[str, Any] | None:
        found: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            # Imported here, at the error: with it imported beside the collector, a spawned
            # rank that exits on its error lost the error's recording in a fresh install
            # (found by the test of one; not understood further).
            from memdoc.collectors.torch_frames import model_in_hand, module_in_hand

            module = module_in_hand(exc, self._torch)
            if module is not None:
                found["module_in_hand"] = module
            model = model_in_hand(exc, self._torch)
            if model is not None:
                found["model_in_hand"] = model
        return {**found, **(self._allocator_context(exc) or {})} or None

    def _allocator_context(self, exc: BaseException) -> Mapping[str, Any] | None:
        if not self._is_torch_oom(exc):
            return None
        with self._lock:
            observed = self._observed.pop() if self._observed else None
        if observed is not None:
            return {"stats": observed.stats, "observed_by": "oom_observer"}
        if self._cuda_off or not self._gate.is_initialized():
            return None
        try:
            return {"stats": device_oom_stats(self._gate, self._failed_device(exc))}
        except Exception:
            return None

    def on_mark(self, label: str, data: Mapping[str, Any]) -> None:
        if data.get("snapshot") and self._recording:
            self._save_snapshot("mark", label=label)

    # -- the OOM observer ----------------------------------------------------------------

    def observe_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """Called by the allocator, in the failing thread, before it raises; the program may
        still catch the error. Never raises."""
        try:
            stats = device_oom_stats(self._gate, device)
            if self._recording:
                self._save_snapshot("oom")
            observed = _ObservedOom(
                time.time(), device, alloc, device_allocated, device_free, stats
            )
            with self._lock:
                self._observed.append(observed)
        except Exception:
            pass

    def _emit_unclaimed_ooms(self, unix_t: float | None) -> None:
        if not self._observed or self._session is None:
            return
        with self._lock:
            due = [
                o for o in self._observed if unix_t is None or unix_t - o.t >= OOM_CLAIM_WINDOW_S
            ]
            self._observed = [o for o in self._observed if o not in due]
        for observed in due:
            self._session.emit(EventKind.OOM, self._observed_event_data(observed))

    def _observed_event_data(self, observed: _ObservedOom) -> dict[str, Any]:
        capped = observed.device in self._fractions
        oom = OomInfo(
            framework=FRAMEWORK,
            kind=OomKind.ALLOCATOR,
            message="CUDA out of memory (seen by the allocator's OOM observer; the program "
            "caught the error)",
            device=observed.device,
            device_type="gpu",
            requested_bytes=observed.requested_bytes,
            total_bytes=None if capped else observed.limit_or_total_bytes,
            limit_bytes=observed.limit_or_total_bytes if capped else None,
            free_bytes=observed.free_bytes,
            allocated_bytes=observed.stats.get("allocated_bytes"),
            reserved_bytes=observed.stats.get("reserved_bytes"),
            private_pool_bytes=observed.stats.get("private_pool_bytes"),
        )
        return {
            "oom": oom.to_dict(),
            "stats": observed.stats,
            "handled": True,
            "observed_by": "oom_observer",
        }

    # -- CUDA -----------------------------------------------------------------------------

    def _on_cuda_initialised(self) -> None:
        self._cuda_ready = True
        session = self._session
        count = self._gate.device_count()
        devices = [self._gate.device(i) for i in range(count)]
        self._devices = {}
        self._next_slow_t = 0.0
        _relay.attach(self._gate, self)
        if self.record_allocations:
            self._gate.record_history(HISTORY_MAX_ENTRIES)
            self._recording = True
        if session is not None:
            session.collector(CollectorStatus(CUDA_STATUS_NAME, True))
            session.emit(EventKind.FRAMEWORK, self._framework_data(devices))
            session.emit(EventKind.ALLOCATOR_CONFIG, self._allocator_config(count))

    def _slow_tick(self, unix_t: float) -> None:
        """Once a second: pick up devices the program started using, and fraction changes."""
        self._next_slow_t = unix_t + SLOW_INTERVAL_S
        count = self._gate.device_count()
        for index in range(count):
            if index not in self._devices:
                counters = cuda_counters(self._gate.memory_stats(index))
                # Devices the program never allocated on stay out of the trace.
                if counters is not None and counters.reserved_peak_bytes > 0:
                    self._devices[index] = DeviceSeries(index, self._pid)
        if self._read_fractions(count) != self._fractions and self._session is not None:
            self._session.emit(EventKind.ALLOCATOR_CONFIG, self._allocator_config(count))

    def _read_fractions(self, device_count: int) -> dict[int, float]:
        """Per-process memory fractions below 1 (set_per_process_memory_fraction)."""
        fractions: dict[int, float] = {}
        for index in range(device_count):
            fraction = self._gate.memory_fraction(index)
            if fraction is not None and fraction < 1.0:
                fractions[index] = fraction
        return fractions

    def _allocator_config(self, device_count: int) -> dict[str, Any]:
        conf = torch_alloc_conf(self._environ)
        backend = self._gate.allocator_backend()
        if backend:
            conf["backend"] = backend
        self._fractions = self._read_fractions(device_count)
        if self._fractions:
            conf["memory_fraction"] = min(self._fractions.values())
            conf["memory_fraction_by_device"] = {str(k): v for k, v in self._fractions.items()}
        return conf

    def _cuda_failed(self, reason: str) -> None:
        self._devices = {}
        self._cuda_ready, self._cuda_off = False, True  # stay off: no retry every tick
        if self._session is not None:
            self._session.collector(CollectorStatus(CUDA_STATUS_NAME, False, reason=reason))

    def _failed_device(self, exc: BaseException) -> int:
        """The device an OOM message names ("GPU 0 has a total capacity..."), else the
        current one."""
        named = _GPU_IN_MESSAGE.search(str(exc)[:500])
        return int(named.group(1)) if named is not None else self._gate.current_device()

    def _is_torch_oom(self, exc: BaseException) -> bool:
        oom_type = getattr(self._torch, "OutOfMemoryError", None)
        if isinstance(oom_type, type) and isinstance(exc, oom_type):
            return True
        return "CUDA out of memory" in str(exc)[:300]

    def _save_snapshot(self, reason: str, **data: Any) -> None:
        session = self._session
        try:
            payload = pickle.dumps(self._gate.snapshot(), protocol=pickle.HIGHEST_PROTOCOL)
            path = self._files.write(f"memdoc-snapshot-{reason}", ".pickle", payload)
        except Exception as exc:
            if session is not None:
                session.emit(EventKind.NOTE, {"text": f"allocation snapshot not saved: {exc!r}"})
            return
        if session is not None:
            event = {"path": path, "reason": reason, "framework": FRAMEWORK, **data}
            session.emit(EventKind.SNAPSHOT, event)

    # -- steps ----------------------------------------------------------------------------

    def _register_step_hook(self) -> Any:
        # torch.optim drops the `optimizer` attribute in some versions; the module stays.
        module = sys.modules.get("torch.optim.optimizer")
        register = getattr(module, "register_optimizer_step_post_hook", None)
        return register(self._on_optimizer_step) if register is not None else None

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The global optimizer post hook: one step per step of the primary optimizer (a
        GAN's second optimizer, stepped between the first's steps, does not count twice);
        model state when an optimizer becomes primary. Another optimizer that steps twice
        while the primary does not (a fit after a batch-size search, a retry with a fresh
        optimizer) takes over from its second step on."""
        session = self._session
        # A forked child inherits this hook with a session whose thread did not survive.
        if session is None or os.getpid() != self._owner_pid:
            return
        try:
            primary = self._primary() if self._primary is not None else None
            if primary is not None and primary is not optimizer:
                if not self._rival_stepped_again(optimizer):
                    return
                primary = None
            if primary is None:
                self._primary = weakref.ref(optimizer)
                self._rival = None
                for data in model_state_events(self._torch, optimizer):
                    session.emit(EventKind.MODEL_STATE, data)
            else:
                self._rival = None
            session.step(source="optimizer")
        except Exception:
            pass  # never break the program's training step

    def _rival_stepped_again(self, optimizer: Any) -> bool:
        """True on a second step of `optimizer` with no step of the primary in between."""
        rival = self._rival() if self._rival is not None else None
        if rival is optimizer:
            return True
        self._rival = weakref.ref(optimizer)
        return False

    def _framework_data(self, devices: list[dict[str, Any]]) -> dict[str, Any]:
        version = getattr(self._torch, "__version__", None)
        cuda = getattr(getattr(self._torch, "version", None), "cuda", None)
        return {
            "name": FRAMEWORK,
            "version": str(version),
            "cuda_version": cuda,
            "devices": devices,
        }


def model_state_events(torch: Any, optimizer: Any) -> list[dict[str, Any]]:
    """`model_state` event data per device: parameter, gradient and optimizer-state bytes of
    one optimizer, parameters broken down by dtype. One pass over its tensors."""
    per_device: dict[tuple[str, int], dict[str, Any]] = {}

    def entry(tensor: Any) -> dict[str, Any]:
        device = tensor.device
        index = int(device.index or 0) if device.type == "cuda" else -1
        key = (str(device.type), index)
        if key not in per_device:
            per_device[key] = {
                "framework": FRAMEWORK,
                "device": index,
                "device_type": str(device.type),
                "param_bytes": 0,
                "grad_bytes": 0,
                "optimizer_state_bytes": 0,
                "dtype_bytes": {},
                "phase": "first_step",
            }
        return per_device[key]

    seen: set[int] = set()
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) in seen:
                continue
            seen.add(id(param))
            nbytes = _tensor_bytes(param)
            data = entry(param)
            data["param_bytes"] += nbytes
            dtype = str(param.dtype).removeprefix("torch.")
            data["dtype_bytes"][dtype] = data["dtype_bytes"].get(dtype, 0) + nbytes
            if param.grad is not None:
                entry(param.grad)["grad_bytes"] += _tensor_bytes(param.grad)
            for value in optimizer.state.get(param, {}).values():
                if torch.is_tensor(value):
                    entry(value)["optimizer_state_bytes"] += _tensor_bytes(value)
    return list(per_device.values())


def _tensor_bytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())
