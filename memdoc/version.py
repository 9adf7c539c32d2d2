"""memdoc's version, at the bottom layer so that every module may read it."""

from __future__ import annotations

__version__ = "0.1.0"
