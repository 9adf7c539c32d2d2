"""MD016 cudnn-workspace: convolution algorithm search or workspace needs too much memory."""

from __future__ import annotations

from memdoc.oom.stackcues import is_convolution
from memdoc.rules.base import Evidence, Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, STRONG, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import Failure, said
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    ratio_evidence,
    snippet,
)
from memdoc.units import format_bytes


class CudnnWorkspace(RuleSpec):
    slug = "cudnn-workspace"
    code = "MD016"
    title = "Convolution algorithm search or workspace needs too much memory"
    what = """
cuDNN picks a convolution algorithm per shape, and the fastest ones need a scratch
workspace that can be larger than the tensors themselves. Benchmarking candidate algorithms
(`cudnn.benchmark`, TensorFlow and XLA autotuning) allocates workspaces too. When that fails
the error names cuDNN, or a convolution asks for far more than its inputs.
"""
    why = """
Workspace size depends on the algorithm, the shape and the dtype; some algorithms for large
inputs or transposed 3D convolutions want gigabytes. TensorFlow caps autotuning scratch
space and reports "No algorithm worked" when every candidate exceeds it; when the GPU is
already full, cuDNN cannot even create its handle ("Failed to get convolution algorithm").
"""
    confirm = """
- The error mentions cuDNN, convolution algorithms, or autotuning ("Profiling failure on
  CUDNN engine").
- The failing request in a convolution is much larger than the tensors already allocated.
- Setting `torch.backends.cudnn.benchmark = False` (and `deterministic = True`) makes it
  go away.
"""
    fixes = (
        Fix(
            "pytorch",
            "Stop benchmarking algorithms and prefer small-workspace ones",
            snippet(
                """
            import torch

            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
            """
            ),
        ),
        Fix(
            "tensorflow",
            "Let TensorFlow's pool grow so cuDNN has room for its workspace",
            snippet(
                """
            import tensorflow as tf

            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
            """
            ),
        ),
        Fix(
            "jax",
            "Turn XLA's convolution autotuning down",
            'export XLA_FLAGS="--xla_gpu_autotune_level=0"',
            "bash",
        ),
        Fix(
            "any",
            "Use a smaller batch or input size for the convolution",
            "batch_size = batch_size // 2",
        ),
    )
    references = (
        (
            "PyTorch: torch.backends.cudnn",
            "https://pytorch.org/docs/stable/backends.html#torch-backends-cudnn",
        ),
        (
            "TensorFlow: limiting GPU memory growth",
            "https://www.tensorflow.org/guide/gpu#limiting_gpu_memory_growth",
        ),
        (
            "NVIDIA cuDNN developer guide",
            "https://docs.nvidia.com/deeplearning/cudnn/latest/developer/overview.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if fail is None:
            return None
        oom = fail.oom
        involved = facts.frameworks(oom)
        if said(fail).workspace_limit:
            evidence: list[Evidence] = []
            if oom.requested_bytes:
                evidence.append(bytes_evidence("workspace asked for", oom.requested_bytes))
            if oom.limit_bytes:
                evidence.append(bytes_evidence("autotuning limit", oom.limit_bytes))
            summary = "Every convolution algorithm tried needed more scratch memory than allowed."
            return self.finding(facts, Signals(STRONG), summary, evidence, frameworks=involved)
        if oom.library == "cudnn":
            summary = "cuDNN could not get memory for its handle or its convolution workspace."
            return self.finding(
                facts,
                # Possible, not likely: in real threads a cuDNN failure was settled by
                # memory growth or a smaller batch as often as by the workspace itself.
                Signals(POSSIBLE),
                summary,
                [],
                to_confirm=(
                    "retry with cudnn benchmarking off and a smaller batch; if it passes, "
                    "it was the workspace"
                ),
                frameworks=involved,
            )
        return self._large_conv_request(facts, fail)

    def _large_conv_request(self, facts: Facts, fail: Failure) -> Finding | None:
        oom = fail.oom
        in_conv = is_convolution(oom.op) or fail.stack_cues.convolution
        allocated = oom.allocated_bytes
        requested = oom.requested_bytes
        if not in_conv or not requested or not allocated or requested < 2 * allocated:
            return None
        summary = (
            f"A convolution asked for {format_bytes(requested)}, {requested / allocated:.1f}x "
            "everything allocated so far: a workspace, not a tensor."
        )
        evidence = [
            bytes_evidence("requested in the convolution", requested),
            bytes_evidence("allocated", allocated),
            ratio_evidence("request / allocated", requested / allocated),
        ]
        return self.finding(
            facts, Signals(LIKELY), summary, evidence, frameworks=facts.frameworks(oom)
        )


RULE = CudnnWorkspace()
