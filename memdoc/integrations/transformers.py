"""A Hugging Face `TrainerCallback` that records training: steps, epochs, evaluation, the OOM."""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from memdoc.integrations.fit import RecordsFit
from memdoc.session import DEFAULT_INTERVAL_S


class MemdocCallback(RecordsFit, TrainerCallback):  # type: ignore[misc]
    """Record memory during `trainer.train()`: `Trainer(..., callbacks=[MemdocCallback()])`.

    Each optimizer step (`state.global_step`) is a memdoc step, each epoch a mark
    (`epoch N`), evaluation a mark (`eval` at its first batch, `train` once it is done).
    The Trainer has no hook for an exception: an OOM that nobody catches is recorded when
    it reaches the interpreter, or call `finish(exc)` where you catch it. The diagnosis is
    printed once and kept in `diagnosis`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        quiet: bool = False,
    ) -> None:
        self._record("transformers", path, interval_s=interval_s, quiet=quiet)
        self._in_eval = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            self.recording.one_trace_per_rank(args.process_index)
        self.recording.start()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        epoch = int(state.epoch or 0)
        self.recording.mark(f"epoch {epoch}", epoch=epoch)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recording.step(global_step=int(state.global_step))

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._in_eval:
            self._in_eval = True
            self.recording.mark("eval")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_eval()

    def on_predict(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
    ) -> None:
        self._end_eval()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recording.finish()

    def _end_eval(self) -> None:
        if self._in_eval:
            self._in_eval = False
            self.recording.mark("train", after="eval")
