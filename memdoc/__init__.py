"""memdoc: GPU memory and OOM diagnostics for PyTorch, TensorFlow/Keras and JAX."""

from __future__ import annotations

from typing import Any

from memdoc.api import mark, step, watch
from memdoc.version import __version__

__all__ = ["__version__", "load_ipython_extension", "mark", "step", "watch"]


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext memdoc` in IPython or Jupyter: the `%%memdoc` cell magic and friends."""
    from memdoc.integrations.jupyter import load_ipython_extension as load

    load(shell)
