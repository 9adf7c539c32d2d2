"""Train with JAX while an evaluation worker, also using JAX, runs on the same GPU.

The bug: JAX reserves 75% of the GPU's memory the first time it uses it
(`XLA_PYTHON_CLIENT_PREALLOCATE`, on by default), whatever the program needs. The trainer
needs a few MiB but holds three quarters of the GPU, so the evaluation worker it starts,
which needs a third of the GPU, cannot get it. `nvidia-smi` shows the GPU "full" from the
first second. Set `XLA_PYTHON_CLIENT_PREALLOCATE=false` (or a `XLA_PYTHON_CLIENT_MEM_FRACTION`
that leaves room) in both processes.

GPU only: JAX does not pre-allocate host memory.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp

WIDTH = 1024


def train_step(params: jax.Array, batch: jax.Array) -> jax.Array:
    grads = jax.grad(lambda p: jnp.mean((batch @ p) ** 2))(params)
    return params - 1e-3 * grads


def evaluate(working_set_bytes: int) -> None:
    params = jnp.ones((WIDTH, WIDTH))
    rows = working_set_bytes // (2 * WIDTH * 4)  # the batch and its outputs
    batch = jax.random.normal(jax.random.key(1), (rows, WIDTH))
    print(f"evaluation loss: {float(jnp.mean((batch @ params) ** 2)):.3f}", flush=True)


def main() -> None:
    device = jax.devices()[0]
    if device.platform == "cpu":
        sys.exit("this example needs a GPU: JAX does not pre-allocate host memory")
    params = jnp.ones((WIDTH, WIDTH))
    step = jax.jit(train_step)
    for i in range(1, 4):
        batch = jax.random.normal(jax.random.key(i), (256, WIDTH))
        params = step(params, batch)
    pool_bytes = device.memory_stats()["bytes_limit"]
    print(f"trained; JAX's pool in this process: {pool_bytes / 2**30:.1f} GiB", flush=True)
    # Evaluate in a separate worker, as pipelines do, on the same GPU. It needs a third of
    # the GPU (0.45 of this process's pool, which is 75% of the GPU).
    worker = [sys.executable, __file__, "--evaluate", str(int(0.45 * pool_bytes))]
    subprocess.run(worker, check=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--evaluate"]:
        evaluate(int(sys.argv[2]))
    else:
        main()
