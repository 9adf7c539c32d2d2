"""Keras 3 `fit`, `evaluate` and `predict`, on any backend (TensorFlow, JAX, torch).

Every Keras loop drives a `CallbackList`, whatever callbacks the user passed (none
included): its batch-end call is a step of `fit`, its begin and end calls bound the phases.
memdoc wraps those methods of the class; it adds no callback, so Keras's own choices (its
asynchronous callback dispatch, `steps_per_execution`) are untouched. With
`steps_per_execution=N`, one step is recorded per N batches, with the last batch's index.
"""

from __future__ import annotations

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
    def report(*args: Any, **kwargs: Any) -> None:
        hub.enter(phase, SOURCE, grad_enabled=grad)

    return hub.after(report)


def _end(phase: str) -> Any:
    def report(*args: Any, **kwargs: Any) -> None:
        hub.leave(phase, SOURCE)

    return hub.after(report)


def _batch_end(callbacks: Any, batch: Any = None, *args: Any, **kwargs: Any) -> None:
    if isinstance(batch, int):
        hub.step(SOURCE, batch=batch)
    else:
        hub.step(SOURCE)
