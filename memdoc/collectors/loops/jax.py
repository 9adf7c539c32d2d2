"""JAX: a jitted (or pmapped) function of the program, called again and again, is its step.

JAX runs a compiled call in C++ without any Python hook, so memdoc watches the functions
`jax.jit` and `jax.pmap` return from the moment `jax` is imported: each is handed back
inside a thin proxy that counts its calls and otherwise is the jitted function (its
`lower`, `trace`, `eval_shape`, name, signature and method binding are the original's).

How the step is chosen, once per process: the first jitted function of the program's own
code (not of JAX, Flax, Optax, Keras... which jit their internals) that is called a second
time, whose name does not say evaluation (`eval_step`, `validate`, `test_fn`, `predict`).
From then on each of its calls is a step. Calls of a function named for evaluation between
two steps are the evaluation phase; the next step resumes training. A program that runs
its whole loop inside one compiled call (`lax.scan`, `fori_loop`) has no steps to count.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from memdoc.collectors.loops import hub
from memdoc.collectors.loops.imports import when_imported

SOURCE = "jax"

_EVAL_NAMES = ("eval", "evaluate", "evaluation", "valid", "validate", "validation", "test")
_PREDICT_NAMES = ("predict", "prediction", "infer", "inference", "generate", "sample")
# Packages that jit their own internals: their functions are never the program's step.
_LIBRARIES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "equinox",
    "haiku",
    "keras",
    "tensorflow",
    "torch",
    "transformers",
    "orbax",
    "chex",
)


def install() -> None:
    when_imported("jax", _patch)


def _patch(module: ModuleType) -> None:
    for name in ("jit", "pmap"):
        hub.wrap(module, name, _watching)


def _watching(transform: Callable[..., Any]) -> Callable[..., Any]:
    """`jax.jit` as before, its result watched (also when used as `jit(**options)(f)`)."""

    def transform_watched(*args: Any, **kwargs: Any) -> Any:
        made = transform(*args, **kwargs)
        if hasattr(made, "lower"):
            return Watched(made)
        if callable(made):  # a decorator still waiting for its function
            return functools.wraps(made)(lambda f: Watched(made(f)))
        return made

    return transform_watched


class Watched:
    """A jitted function, counted. Calls, attributes, binding and signature are its own."""

    def __init__(self, jitted: Any) -> None:
        functools.update_wrapper(self, jitted)
        self._memdoc_jitted = jitted
        self._memdoc_kind = _kind(jitted)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            out = self._memdoc_jitted(*args, **kwargs)
        except Exception as exc:
            # What memdoc reads of this call at the error (what XLA planned, the optimizer's
            # state among its arguments) is handed over, not read from this running frame.
            _FAILING.call = (self, args, kwargs)
            try:
                hub.raised(exc)
            finally:
                _FAILING.call = None
            raise
        if hub.listening():
            _STEPS.called(self)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_memdoc_jitted"], name)

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __repr__(self) -> str:
        return repr(self._memdoc_jitted)


def jitted_call(exc: BaseException) -> str | None:
    """The name of the program's jitted function whose call raised `exc`; "" when none of
    the program's jitted functions was on the way (an eager operation raised it); None when
    memdoc does not watch `jax.jit` in this process, or when the error surfaced where a
    result was read (it may be any earlier call's)."""
    jit = getattr(sys.modules.get("jax"), "jit", None)
    if not getattr(jit, "__memdoc_wrapped__", False):
        return None
    call = _failed_call(exc)
    if call is not None:
        return str(getattr(call[0], "__name__", "") or "<jitted>")
    names: list[str] = []
    tb = exc.__traceback__
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    if any(name in _READING_A_VALUE for name in names[-4:]):
        return None  # an earlier call's error surfaced where its result was read
    return ""


def compiled_memory(exc: BaseException) -> dict[str, int] | None:
    """What XLA planned for the compiled program of the jitted call that raised `exc`, from
    its own memory analysis: its arguments, outputs, the part of the outputs written into
    donated arguments (`alias`), and its temporaries, in bytes. The call had just been
    compiled, so lowering and compiling it again are cache hits (well under a millisecond,
    the function is not traced again). None where no jitted call of the program raised it
    or XLA does not say."""
    call = _failed_call(exc)
    if call is None:
        return None
    watched, args, kwargs = call
    try:
        stats = watched._memdoc_jitted.lower(*args, **kwargs).compile().memory_analysis()
        return {
            name: int(getattr(stats, f"{name}_size_in_bytes"))
            for name in ("argument", "output", "alias", "temp")
        }
    except Exception:
        return None  # an older JAX, a backend without the analysis, or no longer compilable


def optimizer_state_bytes(exc: BaseException) -> int | None:
    """The bytes of the optimizer's state among the arguments of the jitted call that raised
    `exc`: an Optax state (Adam's `mu` and `nu`...), the moments of a
    `jax.example_libraries.optimizers` state (its parameters left out), a Flax `TrainState`'s
    `opt_state`. Read from the arrays' shapes (a donated argument's buffer may be gone).
    None where no jitted call of the program raised it or no optimizer state was passed."""
    call = _failed_call(exc)
    tree_leaves = getattr(getattr(sys.modules.get("jax"), "tree_util", None), "tree_leaves", None)
    if call is None or tree_leaves is None:
        return None
    try:
        arguments = call[1:]
        found = _state_bytes(arguments, tree_leaves, 0)
    except Exception:
        return None
    return found or None


def _state_bytes(value: Any, tree_leaves: Callable[[Any], list[Any]], depth: int) -> int:
    """The optimizer-state bytes under `value`, walking plain containers to a bounded depth."""
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    if kind.__name__ == "OptimizerState" and module.startswith("jax.example_libraries"):
        # One packed (parameter, *state) tuple per parameter leaf.
        return sum(
            _leaf_bytes(part, tree_leaves) for packed in value.packed_state for part in packed[1:]
        )
    if module.split(".")[0] == "optax":
        return _leaf_bytes(value, tree_leaves)
    if "opt_state" in (getattr(kind, "__dataclass_fields__", None) or {}):
        return _leaf_bytes(value.opt_state, tree_leaves)
    if depth >= _MAX_DEPTH:
        return 0
    if isinstance(value, (tuple, list)):
        children: Any = value
    elif isinstance(value, dict):
        children = value.values()
    else:
        return 0
    return sum(_state_bytes(child, tree_leaves, depth + 1) for child in children)


def _leaf_bytes(value: Any, tree_leaves: Callable[[Any], list[Any]]) -> int:
    total = 0
    for leaf in tree_leaves(value):
        nbytes = getattr(leaf, "nbytes", None)
        if isinstance(nbytes, int) and hasattr(leaf, "shape"):
            total += nbytes
    return total


_MAX_DEPTH = 8  # containers walked into, looking for an optimizer's state


# The watched call whose error is being noted on this thread (`Watched.__call__`), while its
# own handler runs: (the watched function, args, kwargs).
_FAILING = threading.local()


def _failed_call(exc: BaseException) -> tuple[Watched, tuple[Any, ...], dict[str, Any]] | None:
    """(watched function, args, kwargs) of the innermost call of a watched jitted function
    on `exc`'s way out; None where none was. Read from its frame once the call has ended;
    while the call is still handling the error, from what it handed over: reading a running
    frame's locals would keep the error, and the failed try's arrays, alive (see
    `running_frames`)."""
    from memdoc.collectors.base import running_frames

    frame = _innermost_call(exc)
    if frame is None:
        return None
    if id(frame) in running_frames():
        call: tuple[Watched, tuple[Any, ...], dict[str, Any]] | None
        call = getattr(_FAILING, "call", None)
        return call
    found = frame.f_locals
    watched = found.get("self")
    return (watched, found.get("args", ()), found.get("kwargs", {})) if watched else None


def _innermost_call(exc: BaseException) -> Any:
    """The frame of the innermost call of a watched jitted function on `exc`'s way out."""
    called = Watched.__call__.__code__
    found = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is called:
            found = tb.tb_frame
        tb = tb.tb_next
    return found


# Where JAX waits for a result and hands it to Python: an error of any earlier call, jitted
# or not, surfaces here (JAX dispatches asynchronously), so the failing call is not known.
_READING_A_VALUE = frozenset(
    {
        "_value",
        "block_until_ready",
        "__array__",
        "device_get",
        "tolist",
        "item",
        "__float__",
        "__int__",
        "__bool__",
        "__index__",
    }
)


class _Steps:
    """Chooses the step function and turns calls into steps and phases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, int] = {}
        self._step_fn: int | None = None
        self._in: str | None = None  # the phase this module last entered

    def called(self, fn: Watched) -> None:
        kind = fn._memdoc_kind
        if kind in (hub.EVAL, hub.PREDICT):
            self._eval_call(kind)
            return
        key = id(fn)
        with self._lock:
            count = self._calls[key] = self._calls.get(key, 0) + 1
            if self._step_fn is None and kind == hub.TRAIN and count >= 2:
                self._step_fn = key
            is_step = key == self._step_fn
        if is_step:
            self._step(count)

    def _step(self, count: int) -> None:
        if self._in in (hub.EVAL, hub.PREDICT):
            hub.leave(self._in, SOURCE)
            self._in = hub.TRAIN
        elif self._in is None:
            hub.enter(hub.TRAIN, SOURCE, grad_enabled=None)
            self._in = hub.TRAIN
        hub.step(SOURCE, call=count)

    def _eval_call(self, kind: str) -> None:
        if self._in == kind:
            return
        if self._in in (hub.EVAL, hub.PREDICT):
            hub.leave(self._in, SOURCE)
        # JAX computes gradients only where the program asks (jax.grad): evaluation does not.
        hub.enter(kind, SOURCE, grad_enabled=False)
        self._in = kind


_STEPS = _Steps()


def _kind(jitted: Any) -> str | None:
    """TRAIN for a candidate step, EVAL or PREDICT by its name, None for a library's own."""
    from memdoc.oom.names import has_words

    fn = _innermost(jitted)
    code = getattr(fn, "__code__", None)
    if code is not None and _in_library(str(code.co_filename)):
        return None
    name = str(getattr(fn, "__name__", "") or getattr(jitted, "__name__", ""))
    if has_words(name, _EVAL_NAMES):
        return hub.EVAL
    if has_words(name, _PREDICT_NAMES):
        return hub.PREDICT
    return hub.TRAIN


def _innermost(fn: Any) -> Any:
    with_wrapped = fn
    for _ in range(16):
        if isinstance(with_wrapped, functools.partial):
            with_wrapped = with_wrapped.func
            continue
        inner = getattr(with_wrapped, "__wrapped__", None)
        if inner is None:
            break
        with_wrapped = inner
    return with_wrapped


def _in_library(filename: str) -> bool:
    """The file belongs to a package that jits its own internals (looked up when the
    function is jitted: Flax may be imported after JAX)."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None) if module is not None else None
        if file and path.startswith(os.path.dirname(os.path.abspath(file)) + os.sep):
            return True
    return False
