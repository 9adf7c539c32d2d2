"""memdoc: GPU memory and OOM diagnostics for PyTorch, TensorFlow/Keras and JAX."""

from __future__ import annotations

from memdoc.api import mark, step, watch

__all__ = ["__version__", "mark", "step", "watch"]
__version__ = "0.1.0"
