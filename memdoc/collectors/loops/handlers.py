"""What an out-of-memory handler calls: `torch.cuda.empty_cache()`, before it tries again.

Python 3.12 tells memdoc of every exception the program catches. Before 3.12 there is no
cheap way to see one, and a memory error raised in a forward pass, which no call memdoc
wraps leaves, is seen only if something happens while the handler holds it: a garbage
collection (`memdoc run` watches them), or a call an OOM handler makes. The usual one
returns the cached blocks to the device before the retry, on CUDA or on any accelerator
(`torch.accelerator.empty_cache()`); code written for both devices calls it on a CPU too,
where it does nothing. memdoc wraps those functions: each call passes through unchanged,
after one `sys.exc_info()`; with a memory error in hand, every session notes it, written
as caught at the program's next step (`Session.note_raised`).

A handler that calls neither (it halves the batch and loops) leaves nothing to see before
3.12, unless asked for (`memdoc run --forward-errors`): then a global forward hook of
PyTorch's, called also when a module's forward raises, notes the error in hand. It puts
every module call on PyTorch's hooked path (one Python call more per module, and a global
hook for `torch.compile` to trace), which is why it is not on by default.
"""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType
from typing import Any

from memdoc.collectors.loops import hub
from memdoc.collectors.loops.imports import when_imported

# Set in the program's environment by `memdoc run --forward-errors`.
FORWARD_ERRORS_ENV = "MEMDOC_FORWARD_ERRORS"
# The namespaces of PyTorch whose `empty_cache` a handler calls.
_CACHES = ("torch.cuda", "torch.accelerator", "torch.mps", "torch.xpu")


def install() -> None:
    when_imported("torch", _patch)


def watch_forward_passes() -> None:
    """Note each memory error that leaves a PyTorch module's forward pass (see above)."""
    when_imported("torch", _hook_forward_passes)


def _hook_forward_passes(torch: ModuleType) -> None:
    register = getattr(torch.nn.modules.module, "register_module_forward_hook", None)
    if register is not None:
        with contextlib.suppress(TypeError):  # a PyTorch without `always_call`
            register(_forward_ended, always_call=True)


def _forward_ended(module: Any, args: Any, output: Any) -> None:
    """Called after every forward, and also when one raised (its output then None): an
    error in hand is noted once, however many modules it leaves."""
    if output is None and hub.listening():
        in_hand = sys.exc_info()[1]
        if in_hand is not None:
            # Its traceback starts at the module call handling it (`_call_impl`): the
            # frames outside that one, the program's among them, complete its stack.
            hub.raised(in_hand, depth=2)


def _patch(torch: ModuleType) -> None:
    for name in _CACHES:
        namespace = sys.modules.get(name)
        if namespace is not None:
            hub.wrap(namespace, "empty_cache", _noting)


def _noting(empty_cache: Any) -> Any:
    def empty_cache_noting(*args: Any, **kwargs: Any) -> Any:
        in_hand = sys.exc_info()[1]
        if in_hand is not None:
            hub.handling(in_hand)
        return empty_cache(*args, **kwargs)

    return empty_cache_noting
