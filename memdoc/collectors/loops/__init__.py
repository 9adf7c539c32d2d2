"""Steps, phases and caught out-of-memory errors from the frameworks' own training loops.

A hand-written PyTorch loop reports its steps through the optimizer's global hook. The
loops people use besides (Keras `fit`, jitted JAX steps, Lightning, the Hugging Face
`Trainer`, accelerate's batch-size finder) are watched here, with no code change: each
module below installs, once per process and the moment its framework is imported, thin
wrappers around the loop's own methods, which report to every memdoc session of the
process and do nothing when none listens. They never change what the loop does or returns.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from memdoc.collectors.loops import hub

if TYPE_CHECKING:
    from memdoc.collectors.base import SessionHandle, Values
    from memdoc.trace.model import CollectorStatus

_installed = threading.Event()


def install_loop_hooks() -> None:
    """Install every loop's hooks (once per process)."""
    if _installed.is_set():
        return
    _installed.set()
    from memdoc.collectors.loops import handlers, jax, keras, lightning, transformers

    for module in (keras, jax, lightning, transformers, handlers):
        module.install()


class LoopCollector:
    """Subscribes its session to the loop hooks while it runs; samples nothing itself."""

    name = "loops"

    def __init__(self) -> None:
        self._session: SessionHandle | None = None

    def probe(self) -> CollectorStatus:
        from memdoc.trace.model import CollectorStatus

        return CollectorStatus(self.name, True)

    def start(self, session: SessionHandle) -> None:
        install_loop_hooks()
        self._session = session
        hub.subscribe(session)

    def sample(self, unix_t: float) -> Values:
        return {}

    def close(self) -> None:
        if self._session is not None:
            hub.unsubscribe(self._session)
            self._session = None
