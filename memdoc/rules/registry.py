"""The catalogue: one table of every rule, by slug, in code order."""

from __future__ import annotations

import difflib

from memdoc.rules.base import Rule, RunRule
from memdoc.rules.causes import (
    activations_too_large,
    checkpoint_load_spike,
    cuda_context_overhead,
    cuda_graph_pools,
    cudnn_workspace,
    eval_without_no_grad,
    fragmentation,
    framework_preallocation,
    host_oom,
    leak_across_steps,
    memory_fraction_cap,
    model_too_large,
    multi_framework,
    nccl_buffers,
    no_mixed_precision,
    optimizer_state,
    other_process,
    retain_graph,
    single_allocation_too_large,
    variable_shapes,
    wrong_device,
    xla_temp_buffers,
)
from memdoc.rules.ranks import RANK_FAILED_FIRST, RANK_MEMORY_SKEW

# Rules that read one trace (or one error text). Codes are stable: never renumber.
RULES: dict[str, Rule] = {
    rule.slug: rule
    for rule in (
        fragmentation.RULE,
        other_process.RULE,
        cuda_context_overhead.RULE,
        wrong_device.RULE,
        framework_preallocation.RULE,
        multi_framework.RULE,
        memory_fraction_cap.RULE,
        leak_across_steps.RULE,
        retain_graph.RULE,
        eval_without_no_grad.RULE,
        activations_too_large.RULE,
        single_allocation_too_large.RULE,
        model_too_large.RULE,
        optimizer_state.RULE,
        no_mixed_precision.RULE,
        cudnn_workspace.RULE,
        variable_shapes.RULE,
        checkpoint_load_spike.RULE,
        host_oom.RULE,
        xla_temp_buffers.RULE,
        cuda_graph_pools.RULE,
        nccl_buffers.RULE,
    )
}

# Rules that compare the traces of several ranks.
RUN_RULES: dict[str, RunRule] = {rule.slug: rule for rule in (RANK_FAILED_FIRST, RANK_MEMORY_SKEW)}


# Cross-rank rules that also read one trace holding several ranks (`memdoc run -- torchrun`
# records a whole node in one trace).
NODE_RULES: tuple[Rule, ...] = (RANK_MEMORY_SKEW,)


def all_rules() -> list[Rule]:
    """Every single-trace rule, in code order."""
    return list(RULES.values())


def all_run_rules() -> list[RunRule]:
    """Every cross-rank rule, in code order."""
    return list(RUN_RULES.values())


def get_rule(slug: str) -> Rule | RunRule | None:
    """The rule with this slug (or code, e.g. "MD001"), or None."""
    if slug in RULES:
        return RULES[slug]
    if slug in RUN_RULES:
        return RUN_RULES[slug]
    by_code: dict[str, Rule | RunRule] = {r.code.lower(): r for r in RULES.values()}
    by_code.update({r.code.lower(): r for r in RUN_RULES.values()})
    return by_code.get(slug.lower())


def closest_slug(name: str) -> str | None:
    """The known slug nearest to a mistyped one, for a hint."""
    matches = difflib.get_close_matches(name.lower(), [*RULES, *RUN_RULES], n=1, cutoff=0.4)
    return matches[0] if matches else None
