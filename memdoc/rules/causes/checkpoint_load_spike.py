"""MD018 checkpoint-load-spike: loading a checkpoint onto the GPU doubles memory briefly."""

from __future__ import annotations

from memdoc.kinds import LimitKind
from memdoc.oom.names import has_stem
from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure, said
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    snippet,
)
from memdoc.units import GiB, format_bytes

# Stems of a phase mark's label that loads saved state ("load_checkpoint", "Restoring").
_LOAD_LABEL = ("load", "checkpoint", "restore", "resume")
SPIKE_RATIO = 1.5
MIN_SPIKE_BYTES = 1 * GiB


class CheckpointLoadSpike(RuleSpec):
    slug = "checkpoint-load-spike"
    code = "MD018"
    title = "Loading a checkpoint onto the GPU doubles memory"
    host_title = "Loading a checkpoint doubles memory"
    what = """
While a checkpoint is loaded, two copies of the weights exist at once: the model's own
parameters and the tensors read from the file. When the file is loaded straight onto the GPU
(the default for a checkpoint saved from GPU tensors), the peak is about twice the model.
On the CPU the same holds for the host memory: the loaded copy and the model's parameters
are both in RAM until `load_state_dict` has copied one into the other.
"""
    why = """
`torch.load` restores each tensor on the device it was saved from unless `map_location`
says otherwise, and `load_state_dict` then copies into the existing parameters. Optimizer
state in the same file adds more. The spike is brief, so it fails on load even though the
model trains fine once loaded.
"""
    confirm = """
- The error is raised inside `torch.load`, `load_state_dict`, or a checkpoint restore.
- Memory peaks during loading at well above what remains after it (`memdoc run` with
  `memdoc.mark("load")` records the span).
"""
    fixes = (
        Fix(
            "pytorch",
            "Load onto the CPU, memory-mapped, then copy into the model",
            snippet(
                """
            import torch

            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            model.load_state_dict(state)
            del state
            """
            ),
        ),
        Fix(
            "pytorch",
            "Build the model without weights and take the loaded tensors as its own",
            snippet(
                """
            import torch

            with torch.device("meta"):  # parameters with shapes, but no memory
                model = Net()
            state = torch.load(path, map_location="cpu", weights_only=True)
            model.load_state_dict(state, assign=True)  # one copy of the weights, not two
            """
            ),
        ),
        Fix(
            "pytorch",
            "Use safetensors, which loads tensor by tensor",
            snippet(
                """
            from safetensors.torch import load_model

            load_model(model, "model.safetensors", device="cuda")
            """
            ),
        ),
        Fix(
            "pytorch",
            "Build the model without allocating weights, then load",
            snippet(
                """
            model = AutoModelForCausalLM.from_pretrained(
                name, low_cpu_mem_usage=True, device_map="auto"
            )
            """
            ),
        ),
        Fix(
            "jax",
            "Restore directly into the target sharding",
            snippet(
                """
            import orbax.checkpoint as ocp

            state = ocp.StandardCheckpointer().restore(path, target=abstract_state)
            """
            ),
        ),
    )
    references = (
        (
            "PyTorch: torch.load (map_location, mmap)",
            "https://pytorch.org/docs/stable/generated/torch.load.html",
        ),
        (
            "PyTorch: saving and loading models",
            "https://pytorch.org/tutorials/beginner/saving_loading_models.html",
        ),
        ("safetensors", "https://huggingface.co/docs/safetensors/index"),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if not facts.is_text_only:
            found = self._recorded_spike(facts, fail)
            if found is not None:
                return found
        if fail is None or fail.oom.framework == "host":
            return None
        loading = fail.stack_cues.loading_checkpoint or said(fail).checkpoint_loading
        if not loading:
            return self._loading_phase(facts, fail)
        summary = "The error happened while a checkpoint was being loaded."
        if facts.cpu_only:
            summary = (
                "The error happened while a checkpoint was being loaded: the model's "
                "parameters and the loaded copy were in host memory at once."
            )
        return self.finding(
            facts,
            Signals(LIKELY),
            summary,
            [],
            to_confirm=_to_confirm(facts),
            frameworks=facts.frameworks(fail.oom),
            fixes=_fixes_under(facts, fail),
        )

    def _loading_phase(self, facts: Facts, fail: Failure) -> Finding | None:
        """The text says the job was loading, but not where: a checkpoint is one reading."""
        if fail.oom.phase != "load":
            return None
        return self.finding(
            facts,
            Signals(POSSIBLE),
            "The error came while loading; loading a checkpoint "
            + ("" if facts.cpu_only else "onto the GPU ")
            + "is one cause.",
            [],
            to_confirm=_to_confirm(facts),
            frameworks=facts.frameworks(fail.oom),
            fixes=_fixes_under(facts, fail),
        )

    def _recorded_spike(self, facts: Facts, fail: Failure | None) -> Finding | None:
        marks = [
            m for m in facts.trace.marks() if has_stem(str(m.data.get("label", "")), _LOAD_LABEL)
        ]
        device = facts.failed_device(fail.oom if fail else None)
        allocated = [
            s
            for s in facts.series_named("torch.allocated")
            if device is None or s.key.device == device
        ]
        if not marks or not allocated:
            return None
        series = max(allocated, key=lambda s: max(s.values) if len(s) else 0.0)
        boundaries = sorted({e.t for e in facts.trace.marks()} | set(facts.trace.steps().times()))
        for mark in marks:
            later = [t for t in boundaries if t > mark.t]
            end = later[0] if later else facts.trace.duration_s
            peak = series.max_between(mark.t, end)
            after = series.at(end)
            if peak is None:
                continue
            failed_here = fail is not None and mark.t <= fail.t <= end
            settled = after if after is not None and after > 0 else None
            if settled is None and not failed_here:
                continue
            ratio = peak / settled if settled else None
            if not failed_here and (
                ratio is None or ratio < SPIKE_RATIO or peak - (settled or 0) < MIN_SPIKE_BYTES
            ):
                continue
            evidence = [bytes_evidence("peak while loading", peak)]
            if settled:
                evidence.append(bytes_evidence("after loading", settled))
                evidence.append(ratio_evidence("peak / after", ratio or 0.0))
            signals = Signals.of(LIKELY, failed_there=failed_here, doubled=(ratio or 0) >= 1.8)
            summary = (
                f"Memory peaked at {format_bytes(peak)} while loading ('{mark.data.get('label')}')"
                + (
                    ", where the job failed."
                    if failed_here
                    else f", {ratio:.1f}x what remained after."
                )
            )
            return self.finding(facts, signals, summary, evidence, frameworks=facts.frameworks())
        return None


def _to_confirm(facts: Facts) -> str:
    if facts.cpu_only:
        return (
            "build the model on the meta device and load with `assign=True`; the peak while "
            "loading should drop by the size of the weights"
        )
    return 'check `map_location` in torch.load; load to "cpu" and compare'


def _fixes_under(facts: Facts, fail: Failure) -> tuple[Fix, ...]:
    """The rule's fixes, less a memory-mapped load where an address-space cap applied: a
    mapping counts against the cap as much as a copy does, so it cannot help there."""
    limits = facts.host_limits(fail.pid, fail.host)
    if not (limits and limits[0].kind == LimitKind.RLIMIT_AS):
        return RULE.fixes
    return tuple(f for f in RULE.fixes if "mmap=True" not in f.code)


RULE = CheckpointLoadSpike()
