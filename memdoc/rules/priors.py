"""How often each cause ended a real incident: the order when the evidence cannot tell."""

from __future__ import annotations

from memdoc.kinds import OomKind
from memdoc.trace.model import OomInfo

# Incidents of the development half of memdoc's labelled corpus of real public threads
# (tests/fixtures/corpus/incidents.jsonl, `"split": "dev"`) whose thread settled on each
# cause. tests/rules/test_priors.py recounts them, so the table follows the corpus.
INCIDENTS_BY_CAUSE: dict[str, int] = {
    "activations-too-large": 150,
    "host-oom": 94,
    "model-too-large": 38,
    "framework-preallocation": 28,
    "single-allocation-too-large": 27,
    "other-process": 24,
    "leak-across-steps": 23,
    "eval-without-no-grad": 13,
    "wrong-device": 10,
    "fragmentation": 8,
    "multi-framework": 7,
    "memory-fraction-cap": 6,
    "optimizer-state": 6,
    "checkpoint-load-spike": 5,
    "cuda-graph-pools": 4,
    "cuda-context-overhead": 3,
    "cudnn-workspace": 3,
    "no-mixed-precision": 3,
    "xla-temp-buffers": 3,
    "variable-shapes": 2,
    "nccl-buffers": 1,
    "retain-graph": 1,
}
INCIDENTS = sum(INCIDENTS_BY_CAUSE.values())
# Causes a guess never names: the host's (for a device error), and a request too large for
# the device, which its own rule reads from the request whenever the error gives one.
NEVER_GUESSED = frozenset({"host-oom", "single-allocation-too-large"})
# Causes of a device (not host) memory error, most common first.
GPU_CAUSES = tuple(
    slug
    for slug, _ in sorted(INCIDENTS_BY_CAUSE.items(), key=lambda item: -item[1])
    if slug not in NEVER_GUESSED
)
# How many of the most common causes a bare error is read as.
BARE_CAUSES = 3
# Causes that only some frameworks have: preallocation is TensorFlow's and JAX's habit,
# autograd graphs in evaluation PyTorch's.
ONLY_IN = {
    "framework-preallocation": frozenset({"tensorflow", "jax"}),
    "eval-without-no-grad": frozenset({"pytorch"}),
}


def common_causes(framework: str, count: int | None = BARE_CAUSES) -> tuple[str, ...]:
    """The `count` most common causes of a device memory error that this framework can
    have (all of them, most common first, for None)."""
    possible = [
        slug
        for slug in GPU_CAUSES
        if framework in ("unknown", "") or framework in ONLY_IN.get(slug, {framework})
    ]
    return tuple(possible[:count])


def prior_rank(slug: str) -> int:
    """0 for the most common cause; causes the corpus never settled on come last."""
    ranked = sorted(INCIDENTS_BY_CAUSE, key=lambda s: -INCIDENTS_BY_CAUSE[s])
    return ranked.index(slug) if slug in ranked else len(ranked)


# Libraries whose out-of-memory says nothing of its own cause (the CUDA or HIP runtime,
# TensorRT, OpenCL, Vulkan, cuSPARSE, nvJPEG): read like the framework's own OOM. cuDNN,
# cuBLAS and NCCL have rules.
GENERIC_LIBRARIES = frozenset(
    {None, "cuda", "hip", "trt", "opencl", "vulkan", "cusparse", "nvjpeg"}
)


def is_bare(oom: OomInfo) -> bool:
    """A device memory error that says nothing of the device: no total, free or held memory,
    no shape, no library and no phase (the size of the failed request alone tells nothing)."""
    return (
        oom.kind in (OomKind.ALLOCATOR, OomKind.DISGUISED)
        and oom.framework != "host"
        and oom.library in GENERIC_LIBRARIES
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


def on_gpu(oom: OomInfo) -> bool:
    """A device (not host) memory error that names no specific library failing."""
    return (
        oom.kind in (OomKind.ALLOCATOR, OomKind.DISGUISED, OomKind.COMPILE)
        and oom.framework != "host"
        and oom.device_type not in ("cpu",)
        and oom.library in GENERIC_LIBRARIES
    )
