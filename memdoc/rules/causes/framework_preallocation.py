"""MD005 framework-preallocation: TensorFlow or JAX took the GPU memory up front."""

from __future__ import annotations

from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    framework_name,
    framework_names,
    library_name,
    starved_library,
)
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.model import EventKind, Metric, framework_metric

PREALLOCATING = ("tensorflow", "jax")
# A pool this close to the device size, early in the run, was taken up front.
PREALLOCATED_SHARE = 0.7
EARLY_S = 30.0


class FrameworkPreallocation(RuleSpec):
    slug = "framework-preallocation"
    code = "MD005"
    title = "TensorFlow or JAX took the GPU memory up front"
    what = """
TensorFlow maps nearly all of a GPU's memory when it first uses it, and JAX (XLA) takes 75%
at its first operation, unless told otherwise. Anything else that needs device memory later
(cuDNN and cuBLAS handles, NCCL buffers, another framework, another process) finds the GPU
full, and often fails with an error that does not say "out of memory".
"""
    why = """
Preallocation makes the frameworks' own allocators fast and predictable, so it is the
default. The price is that `nvidia-smi` shows the GPU full from the start (which is normal
and misleading), and that libraries allocating outside the framework's pool fail: "Could not
create cudnn handle", "Failed to get convolution algorithm", `CUBLAS_STATUS_NOT_INITIALIZED`,
"DNN library initialization failed", or NCCL's "unhandled system error".
"""
    confirm = """
- The error is a cuDNN, cuBLAS, DNN-library or NCCL initialization failure in a program that
  uses TensorFlow or JAX.
- `nvidia-smi` shows the process holding nearly the whole GPU right after start.
- `memdoc run` records the pool size and the allocator configuration at start.
"""
    fixes = (
        Fix(
            "tensorflow",
            "Let TensorFlow grow its pool as needed (before any GPU use)",
            snippet(
                """
            import tensorflow as tf

            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
            """
            ),
        ),
        Fix(
            "tensorflow",
            "The same, from the environment",
            "export TF_FORCE_GPU_ALLOW_GROWTH=true",
            "bash",
        ),
        Fix(
            "jax",
            "Turn JAX's preallocation off",
            "export XLA_PYTHON_CLIENT_PREALLOCATE=false",
            "bash",
        ),
        Fix(
            "jax",
            "Or leave room for other users of the GPU",
            "export XLA_PYTHON_CLIENT_MEM_FRACTION=.60",
            "bash",
        ),
    )
    references = (
        (
            "TensorFlow: limiting GPU memory growth",
            "https://www.tensorflow.org/guide/gpu#limiting_gpu_memory_growth",
        ),
        (
            "JAX: GPU memory allocation",
            "https://jax.readthedocs.io/en/latest/gpu_memory_allocation.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        preallocated = None if facts.is_text_only else _preallocated(facts)
        if fail is None:
            if preallocated is None:
                return None
            framework, share, evidence = preallocated
            summary = (
                f"{framework_name(framework)} took {share:.0%} of the GPU at start: "
                "a full GPU in nvidia-smi is expected here, not a leak."
            )
            return self.finding(facts, Signals(POSSIBLE), summary, evidence, frameworks=[framework])
        oom = fail.oom
        outside = starved_library(fail)
        if preallocated is not None and outside:
            framework, share, evidence = preallocated
            summary = (
                f"{framework_name(framework)} took {share:.0%} of the GPU at start, and then "
                f"{library_name(oom)} could not get memory."
            )
            return self.finding(facts, Signals(STRONG), summary, evidence, frameworks=[framework])
        involved = [f for f in facts.frameworks(oom) if f in PREALLOCATING]
        if outside:
            return self._starved_library(facts, fail, involved)
        if involved and oom.library in ("cuda", "hip"):
            return self._own_growth_failed(facts, fail, involved)
        return None

    def _starved_library(self, facts: Facts, fail: Failure, involved: list[str]) -> Finding:
        """cuDNN, cuBLAS or NCCL found no memory: the classic sign of preallocation."""
        library = library_name(fail.oom)
        if involved:
            names = framework_names(involved)
            summary = (
                f"{library} could not get memory in a {names} program: {names} preallocates "
                "the GPU by default, leaving little for libraries outside its pool."
            )
            signals = Signals(LIKELY)
        elif fail.oom.framework in ("unknown", "", "host"):
            summary = (
                f"{library} could not get memory: the usual cause is a GPU filled up front by "
                "TensorFlow or JAX."
            )
            signals = Signals(POSSIBLE)
        else:
            # A framework that does not preallocate (PyTorch) meets such a GPU only through
            # another program or a second framework beside it.
            summary = (
                f"{library} could not get memory in a {framework_name(fail.oom.framework)} "
                "program, which does not fill the GPU up front: a TensorFlow or JAX program "
                "beside it may have."
            )
            signals = Signals(WEAK)
        return self.finding(
            facts,
            signals,
            summary,
            [],
            to_confirm="turn preallocation off (fixes below) and run again",
            frameworks=involved,
        )

    def _own_growth_failed(self, facts: Facts, fail: Failure, involved: list[str]) -> Finding:
        """The framework's own request to the driver failed: another preallocating program?"""
        names = framework_names(involved)
        summary = (
            f"{names} could not get memory from the driver: another {names} program on the "
            "same GPU may have preallocated it."
        )
        return self.finding(
            facts,
            Signals(POSSIBLE),
            summary,
            [],
            to_confirm="run `nvidia-smi` to see whether another program holds the GPU",
            frameworks=involved,
        )


def _preallocated(facts: Facts) -> tuple[str, float, list[Evidence]] | None:
    """(framework, share of the device, evidence) when a pool was near-full early on."""
    for framework in PREALLOCATING:
        started = [
            e.t for e in facts.trace.events(EventKind.FRAMEWORK) if e.data.get("name") == framework
        ]
        t0 = started[0] if started else 0.0
        for quantity in (Metric.LIMIT, Metric.RESERVED):
            metric = framework_metric(framework, quantity)
            for key in facts.trace.series_keys():
                if key.metric != metric or key.device is None or key.device < 0:
                    continue
                total = facts.trace.device_total_bytes(key.device)
                series = facts.trace.series(key.metric, key.device, key.pid)
                if not total or series is None:
                    continue
                early = series.max_between(t0, t0 + EARLY_S)
                if early is not None and early >= PREALLOCATED_SHARE * total:
                    evidence = [
                        bytes_evidence(f"{framework_name(framework)} pool soon after start", early),
                        share_evidence("share of the device", early / total),
                    ]
                    return framework, early / total, evidence
    if not facts.gpu_recorded:
        return None  # preallocation is of a GPU: on the host neither framework does it
    for event in facts.trace.events(EventKind.ALLOCATOR_CONFIG):
        framework = str(event.data.get("framework", ""))
        if framework in PREALLOCATING and (
            event.data.get("allow_growth") is False or event.data.get("preallocate") is True
        ):
            default_share = 0.75 if framework == "jax" else 0.95
            share = float(event.data.get("mem_fraction") or default_share)
            evidence = [
                Evidence(f"{framework_name(framework)} configured to preallocate", 1.0, "flag")
            ]
            return framework, share, evidence
    return None


RULE = FrameworkPreallocation()
