"""A Lightning callback that records a fit: steps, epochs, validation, and the OOM that ends it."""

from __future__ import annotations

import os
import sys
from typing import Any, cast

from memdoc.integrations.fit import RecordsFit
from memdoc.session import DEFAULT_INTERVAL_S


def _callback_base() -> type[Any]:
    """The `Callback` of the Lightning the program imported (`lightning` or `pytorch_lightning`).

    Lightning checks callbacks with `isinstance` against its own package's class, so the base
    must come from the package the program trains with.
    """
    if "lightning.pytorch" not in sys.modules and "pytorch_lightning" in sys.modules:
        import pytorch_lightning

        return cast(type[Any], pytorch_lightning.Callback)
    try:
        import lightning.pytorch

        return cast(type[Any], lightning.pytorch.Callback)
    except ImportError:
        import pytorch_lightning

        return cast(type[Any], pytorch_lightning.Callback)


class MemdocCallback(RecordsFit, _callback_base()):  # type: ignore[misc]
    """Record memory during `trainer.fit`: `Trainer(callbacks=[MemdocCallback()])`.

    Each optimizer step (`trainer.global_step`) is a memdoc step, each epoch a mark
    (`epoch N`), validation a mark (`eval`, then `train` when training resumes). When an
    exception ends the fit, it is recorded, the diagnosis is printed once and kept in
    `diagnosis`; the exception propagates unchanged. `finish(exc)` closes the trace early.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        quiet: bool = False,
    ) -> None:
        super().__init__()
        self._record("lightning", path, interval_s=interval_s, quiet=quiet)
        self._last_global_step = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_rank != 0:
            self.recording.one_trace_per_rank(trainer.global_rank)
        self._last_global_step = int(trainer.global_step)
        self.recording.start()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.recording.mark(f"epoch {trainer.current_epoch}", epoch=int(trainer.current_epoch))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # With gradient accumulation several batches make one optimizer step.
        global_step = int(trainer.global_step)
        if global_step != self._last_global_step:
            self._last_global_step = global_step
            self.recording.step(global_step=global_step, epoch=int(trainer.current_epoch))

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.recording.mark("eval", sanity_check=bool(trainer.sanity_checking))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.recording.mark("train", after="eval")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.recording.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.finish(exception)
