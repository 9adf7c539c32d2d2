"""Lightning: the fit, evaluation and prediction loops as phases, and the batch-size finder.

Steps come from the optimizer (PyTorch's global step hook), as in any PyTorch loop. The
phases come from Lightning's own loop objects: validation (sanity check included), test
and predict run under `torch.no_grad()` or `inference_mode()` by Lightning itself. The
batch-size finder (`Tuner.scale_batch_size`, the `BatchSizeFinder` callback) catches the
out-of-memory errors of its trials: each is recorded with the size tried, each trial size
as a mark, and the search as a phase of its own.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, TypeGuard

from memdoc.collectors.loops import hub
from memdoc.collectors.loops.imports import when_imported

SOURCE = "lightning"
_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def install() -> None:
    for package in _PACKAGES:
        when_imported(package, _patch_package(package))
        when_imported(f"{package}.tuner.batch_size_scaling", _patch_finder)


def _patch_package(package: str) -> Any:
    def patch(module: ModuleType) -> None:
        loops = {
            "fit_loop._FitLoop": (hub.TRAIN, None),
            "evaluation_loop._EvaluationLoop": (hub.EVAL, False),
            "prediction_loop._PredictionLoop": (hub.PREDICT, False),
        }
        for where, (phase, grad) in loops.items():
            loop = _attr(f"{package}.loops.{where}")
            plan = _planned if phase == hub.TRAIN else None
            if loop is not None:
                hub.wrap(loop, "run", hub.around(phase, SOURCE, grad_enabled=grad, plan=plan))
        fit_loop = _attr(f"{package}.loops.fit_loop._FitLoop")
        if fit_loop is not None:  # its data is set up by now: the steps can be counted
            hub.wrap(fit_loop, "on_run_start", hub.after(_say_plan))

    return patch


def _planned(fit_loop: Any, *args: Any) -> int | None:
    """The optimizer steps the fit will still run, where `max_steps` fixes them (the count
    from epochs needs the data set up, which the fit does itself, later)."""
    trainer = getattr(fit_loop, "trainer", None)
    steps, done = getattr(trainer, "max_steps", None), getattr(trainer, "global_step", 0)
    if not isinstance(steps, int) or steps <= 0 or not isinstance(done, int):
        return None
    return steps - done if steps > done else None


def _say_plan(fit_loop: Any, *args: Any, **kwargs: Any) -> None:
    hub.planned(SOURCE, *_epoch_plan(getattr(fit_loop, "trainer", None)))


def _epoch_plan(trainer: Any) -> tuple[int | None, int | None]:
    """(the optimizer steps the fit will still run, those of one epoch), once the fit has
    set up its data: automatic optimization steps its one optimizer every
    `accumulate_grad_batches` batches and at an epoch's last batch. (None, None) for a
    module that steps its optimizers itself, or several, or data of unknown length."""
    module = getattr(trainer, "lightning_module", None)
    optimizers = getattr(trainer, "optimizers", None) or ()
    if getattr(module, "automatic_optimization", False) is not True or len(optimizers) != 1:
        return None, None
    batches = getattr(trainer, "num_training_batches", None)
    accumulate = getattr(trainer, "accumulate_grad_batches", None)
    if not _counts(batches) or not _counts(accumulate):
        return None, None
    per_epoch = -(-batches // accumulate)
    ends = [per_epoch * e for e in [getattr(trainer, "max_epochs", None)] if _counts(e)]
    ends += [s for s in [getattr(trainer, "max_steps", None)] if _counts(s)]
    done = getattr(trainer, "global_step", 0)
    if not ends or not isinstance(done, int) or min(ends) <= done:
        return None, None
    # Epochs are told apart only from one's first step (a fit resumed mid-epoch is not).
    return min(ends) - done, per_epoch if done % per_epoch == 0 else None


def _counts(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _attr(dotted: str) -> Any:
    """`package.module.Class`, if that module is imported (never imports it)."""
    module_name, _, name = dotted.rpartition(".")
    module = sys.modules.get(module_name)
    return getattr(module, name, None) if module is not None else None


def _patch_finder(finder: ModuleType) -> None:
    hub.wrap(finder, "_scale_batch_size", _searching)
    hub.wrap(finder, "is_oom_error", _recording_oom)
    hub.wrap(finder, "_adjust_batch_size", hub.after(_trial_size))


def _recording_oom(is_oom_error: Any) -> Any:
    def is_oom_error_recorded(exception: BaseException) -> Any:
        answer = is_oom_error(exception)
        if answer and hub.listening():
            hub.caught(exception, finder=SOURCE)
        return answer

    return is_oom_error_recorded


def _searching(scale: Any) -> Any:
    """The finder's search as a phase, and its answer marked: the size the fit that
    follows trains at."""
    in_phase = hub.around(hub.SEARCH, SOURCE, grad_enabled=None)(scale)

    def scale_batch_size(*args: Any, **kwargs: Any) -> Any:
        size = in_phase(*args, **kwargs)
        if hub.listening() and isinstance(size, int):
            hub.finder_mark(SOURCE, size, answer="chosen")
        return size

    return scale_batch_size


def _trial_size(trainer: Any, batch_arg_name: str = "batch_size", *a: Any, **k: Any) -> None:
    model = getattr(trainer, "lightning_module", None)
    size = getattr(model, batch_arg_name, None)
    if size is None:
        size = getattr(getattr(model, "hparams", None), batch_arg_name, None)
    if isinstance(size, int):
        hub.finder_mark(SOURCE, size)
