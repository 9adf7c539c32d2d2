"""Find each point's nearest neighbours with a jitted function over the full distance matrix.

The bug: the inputs are small (a few MiB of points), but the compiled program materialises
the N x N matrix of squared distances as a temporary buffer before `top_k` reads it. XLA
cannot fit that temporary and raises `RESOURCE_EXHAUSTED` from inside the jitted call. The
fix is to process the queries in blocks (`jax.lax.map` over chunks) so that the temporary is
block x N, or to rematerialise (`jax.checkpoint`) inside a training step.

On CPU, the process's address space is capped (RLIMIT_AS) at 768 MiB above what JAX needs
to start, as on a small machine; XLA then fails the same way in host memory.
"""

from __future__ import annotations

import math
import resource

import jax
import jax.numpy as jnp

HOST_BUDGET_BYTES = 768 << 20
NEIGHBOURS = 8


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


@jax.jit
def nearest_neighbours(points: jax.Array) -> jax.Array:
    squared = jnp.sum(points * points, axis=1)
    distances = squared[:, None] + squared[None, :] - 2 * points @ points.T  # N x N temporary
    _, indices = jax.lax.top_k(-distances, NEIGHBOURS)
    return indices


def main() -> None:
    device = jax.devices()[0]
    # The N x N float32 distance matrix is 1.2x the memory there is.
    count = math.isqrt(int(1.2 * memory_to_fill(device)) // 4)
    points = jax.random.normal(jax.random.key(0), (count, 3))
    print(f"{count:,} points ({points.nbytes / 2**20:.1f} MiB)", flush=True)
    neighbours = nearest_neighbours(points)
    print(f"neighbours of point 0: {neighbours[0]}")


if __name__ == "__main__":
    main()
