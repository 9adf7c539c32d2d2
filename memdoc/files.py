"""Writing output files whole: a temporary file beside the target, renamed into place."""

from __future__ import annotations

import os
from pathlib import Path

from memdoc.errors import MemdocError


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see a partial file.

    Raises:
        MemdocError: the folder is not writable or the disk is full.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise MemdocError(f"cannot write {path}: {exc.strerror or exc}") from None
