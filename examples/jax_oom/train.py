"""Put a whole image dataset on the device and normalise it there, in JAX.

The bug is a sizing one: the uint8 images fit, but `jnp.asarray(images) / 255.0` makes a
float32 copy four times their size, in one allocation larger than the device. JAX raises
`RESOURCE_EXHAUSTED: Out of memory ...`. Normalise per batch instead (or keep the dataset on
the host and `jax.device_put` one batch at a time).

On CPU, the process's address space is capped (RLIMIT_AS) at 768 MiB above what JAX needs
to start, as on a small machine; JAX then raises the same error for host memory.
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp
import numpy as np

HOST_BUDGET_BYTES = 768 << 20
IMAGE_SHAPE = (64, 64, 3)


def limit_host_memory(budget_bytes: int) -> int:
    """Let this process map only `budget_bytes` more, as on a small machine: it then fails
    in seconds instead of pushing a shared host into swap."""
    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped_bytes + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))
    return budget_bytes


def memory_to_fill(device: jax.Device) -> int:
    """The accelerator's memory; on CPU, a budget this process is then held to."""
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        return int(stats.get("bytes_limit", 16 << 30))
    jnp.ones(1).block_until_ready()  # start JAX's CPU client first: its threads map memory too
    return limit_host_memory(HOST_BUDGET_BYTES)


def load_images(count: int) -> np.ndarray:
    """Stands in for reading the training set from disk."""
    return np.zeros((count, *IMAGE_SHAPE), dtype=np.uint8)


def main() -> None:
    device = jax.devices()[0]
    memory = memory_to_fill(device)
    # The uint8 images take 30% of the memory; as float32 they would take 120%.
    images = load_images(int(0.3 * memory) // int(np.prod(IMAGE_SHAPE)))
    print(f"{len(images):,} images, {images.nbytes / 2**30:.1f} GiB as uint8", flush=True)

    train_set = jnp.asarray(images) / 255.0  # BUG: one float32 copy of the whole dataset
    mean = train_set.mean(axis=(0, 1, 2))
    print(f"per-channel mean: {mean}")


if __name__ == "__main__":
    main()
