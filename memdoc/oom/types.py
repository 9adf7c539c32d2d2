"""Which exceptions can be memory errors, by their type, before any text is read."""

from __future__ import annotations

# Type names (anywhere in the class's bases) that a memory error can have: Python's own,
# PyTorch's (CPU allocator failures are plain RuntimeErrors), TensorFlow's and XLA's.
MEMORY_ERROR_TYPES = frozenset(
    {
        "MemoryError",
        "RuntimeError",
        "OutOfMemoryError",
        "ResourceExhaustedError",
        "XlaRuntimeError",
        "JaxRuntimeError",
        "InternalError",
    }
)


def could_be_memory_error(exc: BaseException) -> bool:
    """A cheap test before the message is parsed: most caught exceptions are not."""
    return any(cls.__name__ in MEMORY_ERROR_TYPES for cls in type(exc).__mro__)
