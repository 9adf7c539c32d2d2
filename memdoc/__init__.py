"""memdoc: GPU memory and OOM diagnostics for PyTorch, TensorFlow/Keras and JAX."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memdoc.version import __version__

if TYPE_CHECKING:
    from memdoc.api import mark, step, watch
    from memdoc.run.headroom import Headroom


def _watch_the_loops() -> None:
    """The frameworks' loops are watched from `import memdoc` on (a function jitted before
    `memdoc.watch` starts is watched too); their hooks report nothing while no session
    listens, and import nothing."""
    from memdoc.collectors.loops import install_loop_hooks

    install_loop_hooks()


_watch_the_loops()

__all__ = ["__version__", "headroom", "load_ipython_extension", "mark", "step", "watch"]


def headroom(
    command: Sequence[str],
    sizes: Sequence[int] = (8, 16, 32),
    *,
    steps: int = 8,
    margin: float = 0.05,
    multiple_of: int = 1,
) -> Headroom:
    """The largest batch size that fits: `command` (with `{}` where the size goes) is run
    under `memdoc run` at each size, at least `steps` steps and on until its peak stops
    rising; sizes are probed up to one that runs out, then bisected until the largest that
    trains and the smallest that does not are adjacent multiples. `result.largest_size` is
    the answer (a size that ran), `result.too_big` the size above it that did not;
    `result.at_least` when every probe trained.

        memdoc.headroom(["python", "train.py", "--batch-size", "{}"], sizes=(16, 32, 64))

    Raises:
        InputError: no `{}` in the command, or fewer than two sizes.
        MemdocError: a size failed for a reason other than memory.
    """
    from memdoc.run.headroom import find_headroom

    return find_headroom(command, sizes, steps=steps, margin=margin, multiple_of=multiple_of)


def __getattr__(name: str) -> Any:
    """`memdoc.watch`, `memdoc.step` and `memdoc.mark`, imported on first use: the sessions
    they need are not loaded by `import memdoc.cli` or the `memdoc` command's start."""
    if name in ("mark", "step", "watch"):
        from memdoc import api

        value = getattr(api, name)
        globals()[name] = value  # later lookups find it without coming here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext memdoc` in IPython or Jupyter: the `%%memdoc` cell magic and friends."""
    from memdoc.integrations.jupyter import load_ipython_extension as load

    load(shell)
