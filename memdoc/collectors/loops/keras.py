"""Keras 3 `fit`, `evaluate` and `predict`, on any backend (TensorFlow, JAX, torch).

Every Keras loop drives a `CallbackList`, whatever callbacks the user passed (none
included): its batch-end call is a step of `fit`, its begin and end calls bound the phases.
memdoc wraps those methods of the class; it adds no callback, so Keras's own choices (its
asynchronous callback dispatch, `steps_per_execution`) are untouched. With
`steps_per_execution=N`, one step is recorded per N batches, with the last batch's index.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

from memdoc.collectors.loops import hub
from memdoc.collectors.loops.imports import when_imported

SOURCE = "keras"

# Keras evaluates and predicts without recording gradients, on every backend.
_PHASES = {
    "train": (hub.TRAIN, None),
    "test": (hub.EVAL, False),
    "predict": (hub.PREDICT, False),
}


def install() -> None:
    when_imported("keras.src.callbacks.callback_list", _patch)


def _patch(module: ModuleType) -> None:
    callbacks: Any = getattr(module, "CallbackList", None)
    if callbacks is None:
        return
    for loop, (phase, grad) in _PHASES.items():
        hub.wrap(callbacks, f"on_{loop}_begin", _begin(phase, grad))
        hub.wrap(callbacks, f"on_{loop}_end", _end(phase))
    hub.wrap(callbacks, "on_train_batch_end", hub.after(_batch_end))


def _begin(phase: str, grad: bool | None) -> Any:
    def report(callbacks: Any = None, *args: Any, **kwargs: Any) -> None:
        plan = fit_plan(callbacks) if phase == hub.TRAIN else None
        epochs, per_epoch = plan or (None, None)
        total = epochs * per_epoch if epochs and per_epoch else None
        hub.enter(phase, SOURCE, grad_enabled=grad, planned_steps=total, epoch_steps=per_epoch)
        if phase == hub.TRAIN:
            model = getattr(callbacks, "model", None)
            weights = weight_bytes(model)
            if weights is not None:
                hub.model_state(weights)
            _awaiting.clear()
            if weights is not None and "optimizer_state_bytes" not in weights:
                _awaiting.append(weakref.ref(model))

    return hub.after(report)


def fit_plan(callbacks: Any) -> tuple[int, int] | None:
    """(the epochs this `fit` will run, the steps it will record in each): one step per
    `steps_per_execution` batches (Keras sets `params` before training begins). None
    where the data's length is unknown (a generator, a dataset that repeats)."""
    params = getattr(callbacks, "params", None)
    if not isinstance(params, dict):
        return None
    epochs, batches = params.get("epochs"), params.get("steps")
    if not isinstance(epochs, int) or not isinstance(batches, int) or epochs <= 0 or batches <= 0:
        return None
    per_call = getattr(getattr(callbacks, "model", None), "steps_per_execution", 1)
    per_call = per_call if isinstance(per_call, int) and per_call > 0 else 1
    return epochs, -(-batches // per_call)


# Bytes per element of the dtypes Keras variables are made of, by name.
_DTYPE_BYTES = {
    "float64": 8,
    "int64": 8,
    "float32": 4,
    "int32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def weight_bytes(model: Any) -> dict[str, Any] | None:
    """The model's weights by dtype, and the optimizer's variables where it has built them,
    from their shapes (no value is read): the `model_state` of a Keras fit, on whatever
    backend. None for a model not built yet."""
    variables = getattr(model, "weights", None)
    if not variables:
        return None
    by_dtype = _bytes_by_dtype(variables)
    data: dict[str, Any] = {
        "framework": _backend_framework(),
        "param_bytes": sum(by_dtype.values()),
        "dtype_bytes": by_dtype,
        "phase": "fit",
        "source": SOURCE,
    }
    state = optimizer_state_bytes(getattr(model, "optimizer", None))
    if state:
        data["optimizer_state_bytes"] = state
    return data


def optimizer_state_bytes(optimizer: Any) -> int:
    """What an optimizer keeps beside the weights (Adam's two moments, a momentum): the bytes
    of its variables once built. `fit` builds them before its first step, so they already
    take their room when that step runs; 0 before."""
    if optimizer is None or not getattr(optimizer, "built", False):
        return 0
    return sum(_bytes_by_dtype(getattr(optimizer, "variables", None) or ()).values())


def _bytes_by_dtype(variables: Any) -> dict[str, int]:
    by_dtype: dict[str, int] = {}
    for variable in variables:
        dtype = str(getattr(variable, "dtype", "float32"))
        count = 1
        for size in tuple(getattr(variable, "shape", ())):
            count *= int(size or 0)
        by_dtype[dtype] = by_dtype.get(dtype, 0) + count * _DTYPE_BYTES.get(dtype, 4)
    return by_dtype


def _backend_framework() -> str:
    import keras

    backend = str(keras.config.backend())
    return {"torch": "pytorch"}.get(backend, backend)


def _end(phase: str) -> Any:
    def report(*args: Any, **kwargs: Any) -> None:
        hub.leave(phase, SOURCE)

    return hub.after(report)


# The model of a fit whose optimizer was not built when training began (on TensorFlow it
# builds inside the first step): its state is recorded at the first step's end instead.
_awaiting: list[weakref.ref[Any]] = []


def _batch_end(callbacks: Any, batch: Any = None, *args: Any, **kwargs: Any) -> None:
    if _awaiting:
        model = _awaiting.pop()()
        weights = weight_bytes(model)
        if weights is not None and "optimizer_state_bytes" in weights:
            weights["phase"] = "first_step"
            hub.model_state(weights)
    if isinstance(batch, int):
        hub.step(SOURCE, batch=batch)
    else:
        hub.step(SOURCE)
