"""MD006 multi-framework: two frameworks in one process each keep a pool on the same GPU."""

from __future__ import annotations

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, POSSIBLE, WEAK, Signals
from memdoc.rules.context import Facts
from memdoc.rules.facts import (
    Failure,
    framework_name,
    framework_names,
    said,
    starved_library,
)
from memdoc.rules.ledger import pool_bytes
from memdoc.rules.spec import (
    RuleSpec,
    bytes_evidence,
    count_evidence,
    share_evidence,
    snippet,
)
from memdoc.trace.ledger import oom_this_process_bytes
from memdoc.units import GiB, format_bytes

# A CUDA context with cuDNN, cuBLAS and NCCL workspaces: what a process may hold beyond its
# framework's pool without another pool beside it.
OUTSIDE_ALLOWANCE_BYTES = 2 * GiB
OUTSIDE_MIN_SHARE = 0.25


class MultiFramework(RuleSpec):
    slug = "multi-framework"
    code = "MD006"
    title = "Two frameworks in one process each keep a pool on the GPU"
    what = """
One process uses two of PyTorch, TensorFlow and JAX (or CuPy) on the same GPU. Each keeps
its own memory pool and neither can use what the other holds: TensorFlow imported only for a
data pipeline can take the whole GPU before JAX or PyTorch allocates anything.
"""
    why = """
Frameworks do not share allocators. TensorFlow and JAX also preallocate most of the device
at first use, so the second framework finds the GPU nearly full. The failure often does not
look like an out-of-memory error: `CUBLAS_STATUS_NOT_INITIALIZED`, "DNN library
initialization failed", "Could not create cudnn handle".
"""
    confirm = """
- The program imports two frameworks (for example `tensorflow_datasets` in a JAX or PyTorch
  training script) and both see the GPU.
- `memdoc run` records a pool for each framework on the same device.
- From a PyTorch message alone: "this process has X memory in use" far above what PyTorch
  reserved (more than a CUDA context and library workspaces take, about 2 GiB), or a log
  that names a second framework.
"""
    fixes = (
        Fix(
            "tensorflow",
            "Hide the GPU from TensorFlow when it only feeds data",
            snippet(
                """
            import tensorflow as tf

            tf.config.set_visible_devices([], "GPU")
            """
            ),
        ),
        Fix(
            "jax",
            "Cap JAX's share so the other framework has room",
            "export XLA_PYTHON_CLIENT_MEM_FRACTION=.50",
            "bash",
        ),
        Fix(
            "pytorch",
            "Cap PyTorch's share of the device",
            snippet(
                """
            import torch

            torch.cuda.set_per_process_memory_fraction(0.5, device=0)
            """
            ),
            gpu_only=True,
        ),
    )
    references = (
        (
            "TensorFlow: tf.config.set_visible_devices",
            "https://www.tensorflow.org/api_docs/python/tf/config/set_visible_devices",
        ),
        (
            "JAX: GPU memory allocation",
            "https://jax.readthedocs.io/en/latest/gpu_memory_allocation.html",
        ),
        (
            "PyTorch: set_per_process_memory_fraction",
            "https://pytorch.org/docs/stable/generated/torch.cuda.set_per_process_memory_fraction.html",
        ),
    )

    def check(self, facts: Facts) -> Finding | None:
        fail = facts.failure
        if not facts.is_text_only:
            return self._recorded(facts, had_failure=fail is not None)
        if fail is None:
            return None
        named = list(said(fail).frameworks_named)
        outside = self._outside_the_pool(facts, fail, named)
        if outside is not None:
            return outside
        if len(named) >= 2 and fail.oom.device_type != "cpu":
            pretty = framework_names(named)
            summary = (
                f"The error names {pretty}: two frameworks in one process each keep a pool on "
                "the GPU, and the first to start can leave too little for the other."
            )
            return self.finding(
                facts,
                Signals(POSSIBLE),
                summary,
                [count_evidence("frameworks the text names", len(named))],
                to_confirm="check whether the program imports both, and which one uses the GPU",
                frameworks=named,
            )
        if fail.oom.library not in ("cudnn", "cublas") or not starved_library(fail):
            return None
        summary = (
            "A GPU library could not initialise: one cause is a second framework in the same "
            "process (often TensorFlow imported for data) holding the GPU."
        )
        return self.finding(
            facts,
            Signals(WEAK),
            summary,
            [],
            to_confirm="check whether the program imports two of PyTorch, TensorFlow and JAX",
        )

    def _outside_the_pool(self, facts: Facts, fail: Failure, named: list[str]) -> Finding | None:
        """The message says what this process held and what the framework's pool held: far
        more outside the pool than a CUDA context and library workspaces take is another
        framework's pool (or another library's memory) in the same process."""
        oom = fail.oom
        own, pool = oom_this_process_bytes(oom), pool_bytes(oom)
        total = facts.device_total(facts.failed_device(oom), oom)
        if own is None or pool is None or not total:
            return None
        outside = own - pool
        if outside < max(OUTSIDE_ALLOWANCE_BYTES, OUTSIDE_MIN_SHARE * total):
            return None
        others = [n for n in named if n != oom.framework]
        framework = framework_name(oom.framework)
        evidence = [
            bytes_evidence("held by this process", own),
            bytes_evidence(f"{framework}'s pool", pool),
            bytes_evidence("held outside the pool", outside),
            share_evidence("outside the pool / device", outside / total),
        ]
        if others:
            pretty = framework_names(others)
            summary = (
                f"This process held {format_bytes(outside)} outside {framework}'s pool, and the "
                f"log names {pretty}: its pool in the same process took the memory."
            )
            signals = Signals(LIKELY)
        else:
            summary = (
                f"This process held {format_bytes(outside)} outside {framework}'s pool: another "
                "framework (TensorFlow, JAX, CuPy) or a library in the same process took it."
            )
            signals = Signals(POSSIBLE)
        return self.finding(
            facts,
            signals,
            summary,
            evidence,
            to_confirm="check what the program imports besides the framework that failed",
            frameworks=[oom.framework, *others],
        )

    def _recorded(self, facts: Facts, *, had_failure: bool) -> Finding | None:
        by_device: dict[int, list[str]] = {}
        for framework, devices in facts.framework_devices().items():
            for device in devices:
                by_device.setdefault(device, []).append(framework)
        for device, names in sorted(by_device.items()):
            if len(names) < 2:
                continue
            pretty = framework_names(names)
            summary = f"{pretty} both kept memory pools on GPU {device}."
            evidence = [count_evidence(f"frameworks with a pool on GPU {device}", len(names))]
            signals = Signals.of(LIKELY, ended_in_failure=had_failure)
            return self.finding(facts, signals, summary, evidence, frameworks=names)
        return None


RULE = MultiFramework()
