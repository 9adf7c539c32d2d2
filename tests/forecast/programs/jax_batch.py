"""A JAX model whose activations grow with the batch, under a memory cap.

Usage: jax_batch.py BATCH [BUDGET_MIB] [STEPS]. Steps are marked with memdoc.step() when
memdoc is present.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from host_cap import cap_address_space, steady_malloc

try:
    from memdoc import step as mark_step
except ImportError:  # runs without memdoc too

    def mark_step() -> None:
        pass


BATCH = int(sys.argv[1])
BUDGET_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 600
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
SEQ, WIDTH = 128, 64

# Run each computation on the calling thread, to its end, one thread at a time: buffers then
# live and die in the same order every run, as on one GPU stream, and so the step's peak
# is the same from run to run.
jax.config.update("jax_cpu_enable_async_dispatch", False)


@jax.jit
def train_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    def loss(w: jax.Array) -> jax.Array:
        h = jax.nn.gelu(x @ w)
        h = jax.nn.gelu(h @ w)
        return jnp.mean(jnp.tanh(h @ w) ** 2)

    value, grad = jax.value_and_grad(loss)(w)
    return w - 1e-3 * grad, value


def main() -> None:
    steady_malloc()
    w = jax.random.normal(jax.random.PRNGKey(0), (WIDTH, WIDTH))
    jnp.ones(4).block_until_ready()
    cap_address_space(BUDGET_MIB << 20)
    for step in range(1, STEPS + 1):
        x = jax.random.normal(jax.random.PRNGKey(step), (BATCH, SEQ, WIDTH))
        w, value = train_step(w, x)
        value.block_until_ready()
        mark_step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
