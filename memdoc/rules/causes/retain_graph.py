"""MD009 retain-graph: autograd graphs kept alive on purpose with retain_graph=True."""

from __future__ import annotations

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import POSSIBLE, STRONG, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    KeptGraphs,
    said,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    snippet,
)
from memdoc.units import format_bytes


class RetainGraph(RuleSpec):
    slug = "retain-graph"
    code = "MD009"
    title = "Autograd graphs kept alive with retain_graph=True"
    what = """
`backward(retain_graph=True)` (or `create_graph=True`) keeps the whole autograd graph and
every activation saved for backward after the backward pass. Called every step, or on a
graph that keeps growing across steps, it holds one more graph each time.
"""
    why = """
`retain_graph=True` is often added to silence "Trying to backward through the graph a second
time", when the real problem is a tensor carried from one step into the next (a hidden
state, a running loss) that links the new graph to the old one. The graph then grows by one
step's worth of activations every iteration.
"""
    confirm = """
- The code that fails calls `backward(retain_graph=True)` or `torch.autograd.grad(...,
  create_graph=True)`.
- `memdoc run` records the first backward that keeps its graph (the program's line that
  called it) and whether any later backward freed one: when none did, every step's graph
  is still alive, whether or not the error came inside a backward call.
- Allocated memory at step boundaries grows steadily (`memdoc run` records it).
- Removing `retain_graph=True` raises "Trying to backward through the graph a second time":
  find the tensor that crosses steps and `.detach()` it.
"""
    fixes = (
        Fix(
            "pytorch",
            "Detach what crosses steps instead of retaining the graph",
            snippet(
                """
            hidden = hidden.detach()  # cut the link to the previous step's graph
            loss.backward()           # no retain_graph
            """
            ),
        ),
        Fix(
            "pytorch",
            "When two backward passes really share a graph, free it after the last one",
            snippet(
                """
            loss_a.backward(retain_graph=True)
            loss_b.backward()  # the last call frees the graph
            """
            ),
        ),
    )
    needs_recording = True
    references = (
        (
            "PyTorch: torch.Tensor.backward",
            "https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html",
        ),
        ("PyTorch: autograd mechanics", "https://pytorch.org/docs/stable/notes/autograd.html"),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return None
        kept = None if facts.is_text_only else facts.kept_graphs
        never_freed = kept is not None and not kept.freed
        if not never_freed and not said(fail).retain_graph:
            return None
        # Growth counts unless a later backward was seen freeing the graphs kept.
        growth = None
        if not facts.is_text_only and (kept is None or never_freed):
            growth = _growth(facts, fail)
        if kept is not None and never_freed and growth is not None:
            return self._never_freed(facts, fail, kept, growth)
        if not said(fail).retain_graph:
            return None
        evidence = [bytes_evidence("growth per step", growth)] if growth else []
        summary = "The failing code keeps autograd graphs alive with retain_graph=True" + (
            ", and memory grew every step." if growth else "."
        )
        # retain_graph=True alone is common and harmless; growth per step makes it the cause.
        signals = Signals(STRONG if growth is not None else POSSIBLE)
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm=None
            if growth
            else "run under `memdoc run` to see whether memory grows per step",
            frameworks=facts.frameworks(fail.oom) or ["pytorch"],
        )

    def _never_freed(self, facts: Facts, fail: Failure, kept: KeptGraphs, growth: float) -> Finding:
        """memdoc saw backward passes keep their graphs and none free one: with memory that
        grew step after step, each step's graph and saved activations are what grew."""
        at = f" at {kept.site}" if kept.site else ""
        summary = (
            f"Backward kept its graph{at} (retain_graph=True) and no later backward freed "
            f"one, and memory grew by {format_bytes(growth)} per step: each step's graph, "
            "with the activations it saved, stayed alive."
        )
        evidence = [
            Evidence(f"backward with retain_graph=True{at}; no backward freed a graph after it"),
            bytes_evidence("growth per step", growth),
        ]
        return self.finding(
            facts,
            Signals.of(STRONG, graphs_never_freed=True),
            summary,
            evidence,
            frameworks=facts.frameworks(fail.oom) or ["pytorch"],
        )


def _growth(facts: Facts, fail: Failure) -> float | None:
    """The run's steady growth per step where the error came, if it grew."""
    device = facts.failed_device(fail.oom)
    curve = facts.step_curve(device if device is not None and device >= 0 else None)
    fitted = facts.steady_growth(curve, fail) if curve is not None else None
    return fitted[0].robust_slope_per_step if fitted is not None else None


RULE = RetainGraph()
