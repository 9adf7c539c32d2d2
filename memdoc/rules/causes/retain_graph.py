"""MD009 retain-graph: autograd graphs kept alive on purpose with retain_graph=True."""

from __future__ import annotations

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import POSSIBLE, STRONG, Signals
from memdoc.rules.facts import baselines, failed_device, failure, frameworks, said, step_curve
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    snippet,
)
from memdoc.rules.trend import fit_trend
from memdoc.trace.reader import Trace


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

    def check(self, trace: Trace) -> Finding | None:
        fail = failure(trace)
        if fail is None or not said(fail).retain_graph:
            return None
        growth = None
        if not trace.is_text_only:
            device = failed_device(trace, fail.oom)
            curve = step_curve(trace, device if device is not None and device >= 0 else None)
            trend = fit_trend(baselines(curve.steps)) if curve is not None else None
            if trend is not None and trend.steps >= 5 and trend.slope_per_step > 0:
                growth = trend.slope_per_step
        evidence = [bytes_evidence("growth per step", growth)] if growth else []
        summary = "The failing code keeps autograd graphs alive with retain_graph=True" + (
            ", and memory grew every step." if growth else "."
        )
        # retain_graph=True alone is common and harmless; growth per step makes it the cause.
        signals = Signals(STRONG if growth is not None else POSSIBLE)
        return self.finding(
            trace,
            signals,
            summary,
            evidence,
            to_confirm=None
            if growth
            else "run under `memdoc run` to see whether memory grows per step",
            frameworks=frameworks(trace, fail.oom) or ["pytorch"],
        )


RULE = RetainGraph()
