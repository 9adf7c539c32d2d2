"""Starts memdoc's agent in every Python process of a `memdoc run`, then the real sitecustomize.

This folder is put first on PYTHONPATH by `memdoc run` (the technique coverage.py uses to
measure subprocesses); it does nothing unless MEMDOC_AGENT is set.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _memdoc_start_agent() -> None:
    if not os.environ.get("MEMDOC_AGENT"):
        return
    try:
        from memdoc.run.agent import activate
    except Exception:  # memdoc is not importable by this Python: run the program unwatched
        return
    activate()


def _memdoc_chain_sitecustomize() -> None:
    """Run the sitecustomize this one hides, if the environment has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_memdoc_start_agent()
_memdoc_chain_sitecustomize()
