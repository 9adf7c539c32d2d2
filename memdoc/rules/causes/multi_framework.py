"""MD006 multi-framework: two frameworks in one process each keep a pool on the same GPU."""

from __future__ import annotations

from memdoc.rules.base import Finding, Fix
from memdoc.rules.confidence import LIKELY, WEAK, Signals
from memdoc.rules.facts import failure, framework_devices, framework_name, starved_library
from memdoc.rules.spec import (
    RuleSpec,
    count_evidence,
    snippet,
)
from memdoc.trace.reader import Trace


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

    def check(self, trace: Trace) -> Finding | None:
        fail = failure(trace)
        if not trace.is_text_only:
            return self._recorded(trace, had_failure=fail is not None)
        if fail is None or fail.oom.library not in ("cudnn", "cublas") or not starved_library(fail):
            return None
        summary = (
            "A GPU library could not initialise: one cause is a second framework in the same "
            "process (often TensorFlow imported for data) holding the GPU."
        )
        return self.finding(
            trace,
            Signals(WEAK),
            summary,
            [],
            to_confirm="check whether the program imports two of PyTorch, TensorFlow and JAX",
        )

    def _recorded(self, trace: Trace, *, had_failure: bool) -> Finding | None:
        by_device: dict[int, list[str]] = {}
        for framework, devices in framework_devices(trace).items():
            for device in devices:
                by_device.setdefault(device, []).append(framework)
        for device, names in sorted(by_device.items()):
            if len(names) < 2:
                continue
            pretty = " and ".join(framework_name(n) for n in names)
            summary = f"{pretty} both kept memory pools on GPU {device}."
            evidence = [count_evidence(f"frameworks with a pool on GPU {device}", len(names))]
            signals = Signals.of(LIKELY, ended_in_failure=had_failure)
            return self.finding(trace, signals, summary, evidence, frameworks=names)
        return None


RULE = MultiFramework()
