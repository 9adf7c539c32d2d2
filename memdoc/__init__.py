"""memdoc: GPU memory and OOM diagnostics for PyTorch, TensorFlow/Keras and JAX."""

from __future__ import annotations

from memdoc.api import mark, step, watch
from memdoc.version import __version__

__all__ = ["__version__", "mark", "step", "watch"]
