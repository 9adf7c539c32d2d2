"""A Keras 3 callback that records `model.fit`: batches as steps, epochs, validation, the OOM."""

from __future__ import annotations

import os
from typing import Any

import keras

from memdoc.integrations.fit import RecordsFit
from memdoc.session import DEFAULT_INTERVAL_S


class MemdocCallback(RecordsFit, keras.callbacks.Callback):  # type: ignore[misc]
    """Record memory during `model.fit(..., callbacks=[MemdocCallback()])`.

    Each training batch is a memdoc step, each epoch a mark (`epoch N`), validation a mark
    (`eval`, then `train`). Keras has no hook for an exception: an OOM that nobody catches is
    recorded when it reaches the interpreter, or call `finish(exc)` where you catch it. The
    diagnosis is printed once and kept in `diagnosis`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        quiet: bool = False,
    ) -> None:
        super().__init__()
        self._record("keras", path, interval_s=interval_s, quiet=quiet)

    def on_train_begin(self, logs: Any = None) -> None:
        self.recording.start()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.recording.mark(f"epoch {epoch}", epoch=int(epoch))

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.recording.step(batch=int(batch))

    # `evaluate` and `predict` outside `fit` call these too: no trace is open then, and the
    # marks go nowhere; only validation inside a fit is a phase of the recorded run.
    def on_test_begin(self, logs: Any = None) -> None:
        self.recording.mark("eval")

    def on_test_end(self, logs: Any = None) -> None:
        self.recording.mark("train", after="eval")

    def on_train_end(self, logs: Any = None) -> None:
        self.finish()
