"""A JAX MLP with a jitted training step (SGD with momentum), under a 200 MiB budget.

Usage: jax_mlp_jit.py BATCH. Trains 12 steps; each step is marked with memdoc.step() when
memdoc is present. Asynchronous dispatch is off, as on one GPU stream: buffers live and die
in the same order every run.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from _cap import cap_address_space, steady_malloc

try:
    from memdoc import step as mark_step
except ImportError:  # runs without memdoc too

    def mark_step() -> None:
        pass


BATCH = int(sys.argv[1])
BUDGET_MIB, STEPS = 200, 12
FEATURES, HIDDEN, CLASSES = 512, 1024, 10

jax.config.update("jax_cpu_enable_async_dispatch", False)


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / FEATURES**0.5,
        "w2": jax.random.normal(k2, (HIDDEN, HIDDEN)) / HIDDEN**0.5,
        "w3": jax.random.normal(k3, (HIDDEN, CLASSES)) / HIDDEN**0.5,
    }


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"])
    h = jax.nn.gelu(h @ params["w2"])
    logits = h @ params["w3"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@jax.jit
def train_step(
    params: dict[str, jax.Array], velocity: dict[str, jax.Array], x: jax.Array, y: jax.Array
) -> tuple[dict[str, jax.Array], dict[str, jax.Array], jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - 0.01 * v, params, velocity)
    return params, velocity, loss


def main() -> None:
    steady_malloc()
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_MIB)
    params = init(jax.random.PRNGKey(0))
    velocity = jax.tree.map(jnp.zeros_like, params)
    for step in range(1, STEPS + 1):
        key = jax.random.PRNGKey(step)
        x = jax.random.normal(key, (BATCH, FEATURES))
        y = jax.random.randint(key, (BATCH,), 0, CLASSES)
        params, velocity, loss = train_step(params, velocity, x, y)
        loss.block_until_ready()
        mark_step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
