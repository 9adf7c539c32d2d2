"""A stand-in for `memdoc.collectors.torch_cuda.TorchCudaGate`, fed with recorded statistics."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cuda_memory_stats"


def recorded_stats(name: str) -> dict[str, Any]:
    """One recorded state (`tests/fixtures/cuda_memory_stats/<name>.json`), as a fresh dict."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`torch.cuda.memory_stats()`'s flat keys back into the nested form PyTorch builds first
    (`memory_stats_as_nested_dict`): "allocated_bytes.all.current" -> [...]["all"]["current"]."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


class RecordedCudaGate:
    """Imitates PyTorch's CUDA runtime as memdoc sees it through the gate, on a machine whose
    devices hold the recorded allocator states the test sets.

    It fails loudly on what memdoc must never do: any CUDA call before the program has
    initialised CUDA (`initialised=False`), and any question about a device it does not
    have. Calls it does not imitate do not exist (AttributeError).
    """

    def __init__(
        self,
        states: Mapping[int, Mapping[str, Any]],
        *,
        initialised: bool = True,
        total_bytes: int = 16 * 1024**3,
        free_bytes: int = 1024**3,
        fractions: Mapping[int, float] | None = None,
        backend: str = "native",
    ) -> None:
        self.states = {index: dict(stats) for index, stats in states.items()}
        self.initialised = initialised
        self.total_bytes = total_bytes
        self.free_bytes = free_bytes
        self.fractions = dict(fractions or {})
        self.backend = backend
        self.observers: list[Callable[[int, int, int, int], None]] = []
        self.history: list[int | None] = []
        self.calls: list[str] = []
        # Kept as well as raised: the collector swallows errors so as not to break the program.
        self.violations: list[str] = []
        self.broken: Exception | None = None

    # -- what the program does --------------------------------------------------------------

    def set_stats(self, index: int, **changes: int) -> None:
        """Change flat keys of a device's state, as the allocator would between two samples."""
        for key, value in changes.items():
            flat_key = key.replace("__", ".")
            assert flat_key in self.states[index], f"not a recorded key: {flat_key}"
            self.states[index][flat_key] = value

    def fail_allocation(self, index: int, requested_bytes: int) -> None:
        """What the caching allocator does when cudaMalloc fails for good: count the OOM, then
        call every observer with (device, size, total or allowed maximum, free)."""
        self.states[index]["num_ooms"] += 1
        limit = int(self.total_bytes * self.fractions.get(index, 1.0))
        for observer in self.observers:
            observer(index, requested_bytes, limit, self.free_bytes)

    def break_with(self, error: Exception) -> None:
        """After a sticky CUDA error (an illegal memory access, say) every call raises it."""
        self.broken = error

    # -- the gate ---------------------------------------------------------------------------

    def is_built(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialised

    def device_count(self) -> int:
        self._expect_initialised("device_count")
        return len(self.states)

    def current_device(self) -> int:
        self._expect_initialised("current_device")
        return min(self.states)

    def device(self, index: int) -> dict[str, Any]:
        self._expect_device("device", index)
        return {"index": index, "name": "NVIDIA A100-SXM4-80GB", "total_bytes": self.total_bytes}

    def memory_stats(self, index: int) -> Mapping[str, Any]:
        self._expect_device("memory_stats", index)
        return nested(copy.deepcopy(self.states[index]))

    def memory_fraction(self, index: int) -> float | None:
        self._expect_device("memory_fraction", index)
        return self.fractions.get(index, 1.0)

    def allocator_backend(self) -> str | None:
        self._expect_initialised("allocator_backend")
        return self.backend

    def mem_get_info(self, index: int) -> tuple[int, int]:
        self._expect_device("mem_get_info", index)
        return self.free_bytes, self.total_bytes

    def attach_oom_observer(self, observer: Callable[[int, int, int, int], None]) -> None:
        self._expect_initialised("attach_oom_observer")
        self.observers.append(observer)

    def record_history(self, max_entries: int | None) -> None:
        self._expect_initialised("record_history")
        self.history.append(max_entries)

    def snapshot(self) -> Any:
        self._expect_initialised("snapshot")
        return {"segments": [], "device_traces": [[] for _ in self.states]}

    def _expect_initialised(self, call: str) -> None:
        self.calls.append(call)
        if self.broken is not None:
            raise self.broken
        if not self.initialised:
            self._violation(f"{call}() before the program initialised CUDA")

    def _expect_device(self, call: str, index: int) -> None:
        self._expect_initialised(call)
        if index not in self.states:
            self._violation(f"{call}({index}): the stand-in has no device {index}")

    def _violation(self, what: str) -> None:
        self.violations.append(what)
        raise AssertionError(what)
