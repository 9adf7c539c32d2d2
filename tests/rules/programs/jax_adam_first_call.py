"""A jitted JAX training step on CPU under an address-space cap, for the fixtures of an
optimizer's state handed to the step with its arguments: whether the first call runs out
because of Adam's moments or because of the batch.

- `STATE=moments` (the hit): two 64 MiB embedding tables trained with Adam
  (`jax.example_libraries.optimizers`): its two moments of each table add 256 MiB to the
  128 MiB of weights, and the first call, which needs a dense gradient of the tables, runs
  out; with SGD the same step fits.
- `STATE=batch` (the near miss): a 1 MiB model trained with Adam on a batch whose
  temporaries alone do not fit: the first call runs out with the moments a sliver of it.
"""

from __future__ import annotations

import os
import resource
from functools import partial

import jax
import jax.numpy as jnp
from jax.example_libraries import optimizers

BUDGET_BYTES = int(os.environ.get("BUDGET_MIB", "480")) << 20
STATE = os.environ.get("STATE", "moments")
ROWS, DIM = (262144, 64) if STATE == "moments" else (4096, 64)
BATCH = 4096 if STATE == "moments" else 1 << 22


def cap_address_space(budget_bytes: int) -> None:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def loss(tables: tuple[jax.Array, jax.Array], pairs: jax.Array) -> jax.Array:
    words, contexts = tables
    scores = jnp.sum(words[pairs[:, 0]] * contexts[pairs[:, 1]], axis=-1)
    return jnp.mean(jax.nn.softplus(-scores))


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1 << 16).block_until_ready()  # start XLA's threads before the cap
    cap_address_space(BUDGET_BYTES)
    key = jax.random.PRNGKey(0)
    tables = (
        jax.random.normal(key, (ROWS, DIM)) * 0.01,
        jax.random.normal(jax.random.fold_in(key, 1), (ROWS, DIM)) * 0.01,
    )
    init, update, params_of = optimizers.adam(1e-3)
    state = init(tables)

    @partial(jax.jit, donate_argnums=(1,))
    def train_step(step: int, state: optimizers.OptimizerState, pairs: jax.Array):  # type: ignore[no-untyped-def]
        grads = jax.grad(loss)(params_of(state), pairs)
        return update(step, grads, state)

    for step in range(5):
        pairs = jax.random.randint(jax.random.fold_in(key, step + 2), (BATCH, 2), 0, ROWS)
        state = train_step(step, state, pairs)
        jax.block_until_ready(state)


if __name__ == "__main__":
    main()
