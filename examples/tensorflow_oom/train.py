"""Fit a Keras model with a batch size far too large for the device.

The bug is a sizing one: `batch_size` was raised for throughput until one step's activations
no longer fit. TensorFlow raises `ResourceExhaustedError` ("OOM when allocating tensor with
shape[262144,64]": the batch is the first dimension) and prints its allocator's state.

On CPU, TensorFlow's host allocator is switched to its BFC allocator with a 256 MiB limit
(the same allocator and error as on a GPU); this must happen before TensorFlow is imported.
As a GPU has no memory beyond its own, the process is then held to an address-space cap
that leaves it little more than that limit: the allocator's limit is all it could have.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

HOST_LIMIT_MB = 256
BEYOND_LIMIT_MB = 32  # the process's room beyond the allocator's limit, on CPU


def gpu_visible() -> bool:
    """Whether TensorFlow will see an NVIDIA GPU (decided before importing it)."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")
    return not hidden and any(Path("/proc/driver/nvidia/gpus").glob("*"))


if not gpu_visible():
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = str(HOST_LIMIT_MB)
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # oneDNN kernels crash on BFC OOM on CPU
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

FEATURES, HIDDEN, DEPTH, CLASSES = 16, 64, 4, 10


def memory_bytes() -> int:
    """What the device can hold: the GPU's memory, or the allocator limit on CPU."""
    if not gpu_visible():
        return HOST_LIMIT_MB << 20
    import pynvml  # nvidia-ml-py: TensorFlow does not report a GPU's total memory

    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)


def hold_address_space(budget: int) -> None:
    """Allow this process `budget` bytes more address space than it maps now."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + budget, hard))


def make_model() -> tf.keras.Model:
    layers = [tf.keras.Input((FEATURES,))]
    layers += [tf.keras.layers.Dense(HIDDEN, activation="relu") for _ in range(DEPTH)]
    layers.append(tf.keras.layers.Dense(CLASSES))
    model = tf.keras.Sequential(layers)
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def main() -> None:
    # Each layer's activations for one batch take a quarter of the device.
    batch_size = memory_bytes() // 4 // (HIDDEN * 4)
    rows = 2 * batch_size
    features = np.random.default_rng(0).standard_normal((rows, FEATURES), dtype=np.float32)
    labels = np.random.default_rng(1).integers(0, CLASSES, rows)
    model = make_model()
    if not gpu_visible():
        # Kernels and thread pools started by a small batch first; then no more room than
        # the allocator's limit (and a little for the rest of the program).
        model.fit(features[:64], labels[:64], batch_size=64, epochs=1, verbose=0)
        hold_address_space((HOST_LIMIT_MB + BEYOND_LIMIT_MB) << 20)
    print(f"fitting with batch_size={batch_size}", flush=True)
    model.fit(features, labels, batch_size=batch_size, epochs=2, verbose=2)


if __name__ == "__main__":
    main()
