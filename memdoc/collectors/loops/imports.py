"""Run a function the moment a module has finished importing, or at once if it has.

Loop hooks must be in place before the program's next line: `from jax import jit` right
after `import jax` has to get the watched `jit`. A finder at the front of `sys.meta_path`
lets the normal finders find the module, then runs the hooks when the module's code has
run, inside the import statement. The loader keeps its identity (the module's `__loader__`
and resources are the real ones); only its `exec_module`, for this one import, is wrapped.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import importlib.machinery

Hook = Callable[[ModuleType], None]

_lock = threading.RLock()
_hooks: dict[str, list[Hook]] = {}


def when_imported(name: str, hook: Hook) -> None:
    """Call `hook(module)` once `name` is imported: now if it is already, else right after
    its code has run. A hook that fails is ignored: the program's import never fails."""
    with _lock:
        module = _complete(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            _finder_first()
            return
    _call(hook, module)


def _complete(name: str) -> ModuleType | None:
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def _call(hook: Hook, module: ModuleType) -> None:
    with contextlib.suppress(Exception):
        hook(module)


class _AfterImport:
    """A meta path finder that finds nothing itself: asks the finders behind it, and wraps
    the found loader."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = _find_behind(self, fullname, path, target)
        finally:
            self._busy.discard(fullname)
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        _run_hooks_after(loader, fullname)
        return spec


def _find_behind(
    finder: _AfterImport, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> importlib.machinery.ModuleSpec | None:
    for other in list(sys.meta_path):
        if other is finder:
            continue
        find = getattr(other, "find_spec", None)
        if find is None:
            continue
        spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _run_hooks_after(loader: Any, fullname: str) -> None:
    original = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        with contextlib.suppress(AttributeError):
            del loader.exec_module  # this import only: the loader is itself again
        original(module)
        with _lock:
            hooks = _hooks.pop(fullname, [])
        for hook in hooks:
            _call(hook, module)

    loader.exec_module = exec_module


_FINDER = _AfterImport()


def _finder_first() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
