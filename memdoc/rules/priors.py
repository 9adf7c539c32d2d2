"""How often each cause ended a real incident: the order when the evidence cannot tell."""

from __future__ import annotations

from memdoc.trace.model import OomInfo

# Incidents of the development half of memdoc's labelled corpus of real public threads
# (tests/fixtures/corpus/incidents.jsonl, `"split": "dev"`) whose thread settled on each
# cause. tests/rules/test_priors.py recounts them, so the table follows the corpus.
INCIDENTS_BY_CAUSE: dict[str, int] = {
    "activations-too-large": 14,
    "host-oom": 13,
    "model-too-large": 8,
    "eval-without-no-grad": 4,
    "framework-preallocation": 4,
    "leak-across-steps": 4,
    "other-process": 4,
    "cuda-graph-pools": 2,
    "checkpoint-load-spike": 1,
    "fragmentation": 1,
    "multi-framework": 1,
    "single-allocation-too-large": 1,
}
INCIDENTS = sum(INCIDENTS_BY_CAUSE.values())
# Causes of a device (not host) memory error, most common first.
GPU_CAUSES = tuple(
    slug
    for slug, _ in sorted(INCIDENTS_BY_CAUSE.items(), key=lambda item: -item[1])
    if slug != "host-oom"
)
# How many of the most common causes a bare error is read as.
BARE_CAUSES = 3


def prior_rank(slug: str) -> int:
    """0 for the most common cause; causes the corpus never settled on come last."""
    ranked = sorted(INCIDENTS_BY_CAUSE, key=lambda s: -INCIDENTS_BY_CAUSE[s])
    return ranked.index(slug) if slug in ranked else len(ranked)


def is_bare(oom: OomInfo) -> bool:
    """A device memory error that gives no numbers, no shape, no library and no phase."""
    return (
        oom.kind in ("allocator", "disguised")
        and oom.framework != "host"
        and oom.library in (None, "cuda")
        and oom.requested_bytes is None
        and not oom.requested_unknown_huge
        and oom.total_bytes is None
        and oom.free_bytes is None
        and oom.allocated_bytes is None
        and oom.reserved_bytes is None
        and oom.limit_bytes is None
        and oom.bfc_in_use_bytes is None
        and oom.xla_temp_bytes is None
        and oom.shape is None
        and oom.phase is None
        and not oom.processes
    )
