"""Read what the user gave to `report` or `diagnose`: memdoc traces, or files other tools wrote."""

from __future__ import annotations

import os
from collections.abc import Sequence

from memdoc.importers import load_any
from memdoc.trace import Run


def load_inputs(paths: Sequence[str | os.PathLike[str]]) -> Run:
    """Traces as they are; snapshots, nvidia-smi logs and profiles converted on the fly.

    Raises:
        MemdocError: a file is missing, unreadable, or of no format memdoc knows.
    """
    return load_any(paths)
