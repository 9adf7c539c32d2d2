"""The Hugging Face `Trainer` and accelerate's batch-size finder.

Steps come from the optimizer (PyTorch's global step hook; accelerate's wrapped optimizer
steps the real one). The `Trainer`'s evaluation and prediction run in its
`evaluation_loop`, under `torch.no_grad()`; `train` is the training phase.
`accelerate.find_executable_batch_size` (which `auto_find_batch_size=True` uses) catches
the out-of-memory errors of each size it tries: each is recorded with the size, and each
try is a mark, so the size that then trained is the last one tried.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any

from memdoc.collectors.loops import hub
from memdoc.collectors.loops.imports import when_imported

SOURCE = "transformers"
FINDER = "accelerate"


def install() -> None:
    when_imported("accelerate.utils.memory", _patch_accelerate)
    when_imported("transformers.trainer", _patch_trainer)


def _patch_trainer(module: ModuleType) -> None:
    trainer: Any = getattr(module, "Trainer", None)
    if trainer is None:
        return
    hub.wrap(trainer, "train", hub.around(hub.TRAIN, SOURCE, grad_enabled=None, plan=_planned))
    hub.wrap(trainer, "evaluation_loop", _evaluation_loop)
    # Where `train` has counted its steps from the data (and a resumed state), before it
    # trains: transformers 4.4x and later.
    hub.wrap(trainer, "_init_training_state", hub.after(_say_plan))
    _rebind_finder_names()


def _planned(trainer: Any, *args: Any) -> int | None:
    """The optimizer steps `train` will run, where the arguments fix them (`max_steps`); the
    count from epochs is made inside `train`, from the data, and is not asked for here."""
    steps = getattr(getattr(trainer, "args", None), "max_steps", None)
    return steps if isinstance(steps, int) and steps > 0 else None


def _say_plan(
    trainer: Any,
    max_steps: Any = None,
    num_update_steps_per_epoch: Any = None,
    *args: Any,
    **kwargs: Any,
) -> None:
    """The plan `train` made: its optimizer steps in all (`max_steps`), less those a resumed
    state had run, and those of one epoch where it starts at an epoch's first step."""
    done = getattr(getattr(trainer, "state", None), "global_step", 0)
    per_epoch = num_update_steps_per_epoch
    if not isinstance(max_steps, int) or not isinstance(done, int) or max_steps <= done:
        return
    if not isinstance(per_epoch, int) or per_epoch <= 0 or done % per_epoch:
        per_epoch = None
    hub.planned(SOURCE, max_steps - done, per_epoch)


def _evaluation_loop(original: Any) -> Any:
    def evaluation_loop(
        self: Any, dataloader: Any, description: str = "", *a: Any, **k: Any
    ) -> Any:
        phase = hub.PREDICT if str(description).lower().startswith("predict") else hub.EVAL
        return hub.in_phase(phase, SOURCE, False, original, self, dataloader, description, *a, **k)

    return evaluation_loop


def _patch_accelerate(memory: ModuleType) -> None:
    hub.wrap(memory, "should_reduce_batch_size", _recording_oom)
    hub.wrap(memory, "find_executable_batch_size", _marking_tries)
    _rebind_finder_names()


def _rebind_finder_names() -> None:
    """The finder's names bound elsewhere before memdoc wrapped them (accelerate imported
    before the session started), where they are still accelerate's own functions: the
    `Trainer` has a `find_executable_batch_size` of its own, with other parameters, which
    calls accelerate's by its module."""
    memory = sys.modules.get("accelerate.utils.memory")
    if memory is None:
        return
    for name in ("accelerate.utils", "accelerate", "transformers.trainer"):
        owner = sys.modules.get(name)
        for attr in ("should_reduce_batch_size", "find_executable_batch_size"):
            wrapped = getattr(memory, attr, None)
            original = getattr(wrapped, "__wrapped__", None)
            if (
                owner is not None
                and original is not None
                and getattr(owner, attr, None) is original
            ):
                setattr(owner, attr, wrapped)


def _recording_oom(should_reduce: Any) -> Any:
    def should_reduce_batch_size(exception: BaseException) -> Any:
        answer = should_reduce(exception)
        if answer and hub.listening():
            hub.caught(exception, finder=FINDER)
        return answer

    return should_reduce_batch_size


def _marking_tries(find: Any) -> Any:
    """`find_executable_batch_size` whose function marks each size it is called with."""

    def find_executable_batch_size(function: Any = None, *args: Any, **kwargs: Any) -> Any:
        if function is None:
            return find(None, *args, **kwargs)
        return find(_marked(function), *args, **kwargs)

    return find_executable_batch_size


def _marked(function: Any) -> Any:
    @functools.wraps(function)
    def trying(batch_size: Any, *args: Any, **kwargs: Any) -> Any:
        if hub.listening() and isinstance(batch_size, int):
            hub.finder_mark(FINDER, batch_size)
        result = function(batch_size, *args, **kwargs)
        if hub.listening() and isinstance(batch_size, int):
            hub.finder_mark(FINDER, batch_size, answer="trained")
        return result

    return trying
