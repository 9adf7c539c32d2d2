"""Whether PyTorch's backward passes free their graphs: `retain_graph=True`, seen as called.

`loss.backward(retain_graph=True)` keeps the graph and every tensor saved for backward after
the pass. It is harmless where a later backward on the same graph frees it (two losses on
one forward pass), and a leak of a whole step's activations per step where none does (the
usual way "Trying to backward through the graph a second time" is silenced). The error text
shows it only when the OOM comes inside that very call; most come in the next forward.

memdoc wraps `torch.autograd.backward`, which `Tensor.backward` calls, and records two
`autograd` events per process at most: the first backward that keeps its graph (with the
program's line that called it), and the first that frees one after that. The wrapper passes
every argument through unchanged and adds one comparison to a call that takes milliseconds.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from memdoc.collectors.base import SessionHandle, note_raised
from memdoc.kinds import GraphsKept
from memdoc.trace.model import EventKind

# Packages that call backward on the program's behalf: the line named is the program's own.
_TORCH_FILES = tuple(f"{os.sep}{name}{os.sep}" for name in ("torch", "lightning", "accelerate"))


class _BackwardWatch:
    """The one wrapper around `torch.autograd.backward`, shared by the sessions that watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: list[SessionHandle] = []
        self._module: Any = None
        self._real: Callable[..., Any] | None = None
        self._wrapper: Callable[..., Any] | None = None
        self._retained = False
        self._freed = False
        self._pid = 0

    def attach(self, torch: Any, session: SessionHandle) -> bool:
        """Watch backward passes for `session`; False where this PyTorch has no
        `torch.autograd.backward` to wrap."""
        module: Any = getattr(torch, "autograd", None)
        real = getattr(module, "backward", None)
        if module is None or not callable(real):
            return False
        with self._lock:
            if self._wrapper is None:
                self._module, self._real, self._pid = module, real, os.getpid()
                self._wrapper = self._wrap(real)
                module.backward = self._wrapper
            self._sessions.append(session)
        return True

    def detach(self, session: SessionHandle) -> None:
        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)
            if self._sessions or self._wrapper is None:
                return
            # Put back the real function, unless someone wrapped ours since: theirs stays.
            if getattr(self._module, "backward", None) is self._wrapper:
                self._module.backward = self._real
            self._module = self._real = self._wrapper = None
            self._retained = self._freed = False

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)
        def backward(*args: Any, **kwargs: Any) -> Any:
            self._saw(args, kwargs)
            try:
                return real(*args, **kwargs)
            except Exception as exc:
                self._raised(exc)
                raise

        return backward

    def _saw(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._freed or os.getpid() != self._pid:
            return  # all there is to say was said, or a forked child's sessions are not ours
        try:
            retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
            create = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
            keeps = bool(create) if retain is None else bool(retain)
            if keeps and not self._retained:
                self._retained = True
                self._emit({GraphsKept.RETAINED: _caller()})
            elif not keeps and self._retained:
                self._freed = True
                self._emit({GraphsKept.FREED: True})
        except Exception:
            pass  # never break the program's backward pass

    def _raised(self, exc: Exception) -> None:
        """A backward pass raised `exc`: the sessions note it, in case it is a memory error
        the program catches (Python before 3.12 has no cheap way to see that)."""
        if os.getpid() != self._pid:
            return
        with contextlib.suppress(Exception):
            note_raised(self._listening(), exc, depth=2)

    def _emit(self, data: dict[str, Any]) -> None:
        for session in self._listening():
            session.emit(EventKind.AUTOGRAD, data)

    def _listening(self) -> list[SessionHandle]:
        with self._lock:
            return list(self._sessions)


def _caller() -> str:
    """The program's line that started the backward pass: the first frame, from the call
    inwards, outside PyTorch and the loops that call backward for the program."""
    frame = sys._getframe(3)  # the wrapper's caller: _caller, _saw, the wrapper, then it
    while frame is not None and any(part in frame.f_code.co_filename for part in _TORCH_FILES):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


watch = _BackwardWatch()
