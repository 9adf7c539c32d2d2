"""A JAX training loop that keeps each step's activations (a leak), under a memory cap.

Usage: jax_leak.py [LEAK_MIB] [BUDGET_MIB] [SLEEP_S] [steady]. Steps are marked with
memdoc.step() when memdoc is present. With `steady`, malloc is made to follow live memory
(see host_cap.steady_malloc); without it, glibc's defaults apply.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
from host_cap import cap_address_space, steady_malloc

try:
    from memdoc import step as mark_step
except ImportError:  # runs without memdoc too

    def mark_step() -> None:
        pass


LEAK_MIB = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
BUDGET_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 600
SLEEP_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.04
STEADY = len(sys.argv) > 4 and sys.argv[4] == "steady"

# Each computation runs to its end on the calling thread, as on one GPU stream (see
# jax_batch.py): buffers live and die in the same order every run.
jax.config.update("jax_cpu_enable_async_dispatch", False)


@jax.jit
def train_step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    def loss(w: jax.Array) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    value, grad = jax.value_and_grad(loss)(w)
    return w - 1e-3 * grad, value


def main() -> None:
    if STEADY:
        steady_malloc()
    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (256, 256))
    x = jax.random.normal(key, (64, 256))
    w, _ = train_step(w, x)
    jnp.ones(4).block_until_ready()
    cap_address_space(BUDGET_MIB << 20)
    kept = []
    leak = int(LEAK_MIB * (1 << 20)) // 4
    for step in range(1, 100_000):
        w, value = train_step(w, x)
        kept.append(jnp.full((leak,), float(step)).block_until_ready())  # the leak
        mark_step()
        print(f"step {step}", flush=True)
        time.sleep(SLEEP_S)


if __name__ == "__main__":
    main()
