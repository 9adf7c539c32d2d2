"""Memory errors the program handles itself: caught and survived, or caught and exited on."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import NoReturn

from memdoc.caught import record_memory_error
from memdoc.session import Session


def exit_recording_error_in_hand(
    real_exit: Callable[..., NoReturn], session: Callable[[], Session | None]
) -> Callable[..., NoReturn]:
    """`sys.exit` as before, after recording a memory error being handled when it is called.

    Programs that catch an error and exit with a status of their own never reach the
    excepthook: `torch.multiprocessing.spawn` ranks (which hand the parent only the text),
    and every `except Exception: log(...); sys.exit(1)`.
    """

    @functools.wraps(real_exit)
    def exit(*args: object) -> NoReturn:
        in_hand = sys.exc_info()[1]
        if isinstance(in_hand, Exception):
            record_memory_error(session, in_hand, where="exit")
        real_exit(*args)

    return exit
