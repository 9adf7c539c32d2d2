"""Train a deep residual MLP in JAX with a jitted step: the weights alone do not fit.

Sixteen residual blocks of 4096 x 4096 float32 weights, sized for a larger machine, are
1 GiB of parameters before any gradient or batch, more than the memory there is (640 MiB).
Each layer's matrix is small enough on its own (64 MiB); they run out together while the
parameters are initialised, layer after layer, before the first step. (Fewer or narrower
blocks, or bfloat16 weights with the model sharded, would fit.)
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
FEATURES, WIDTH, BLOCKS, CLASSES, BATCH, STEPS = 128, 4096, 16, 10, 64, 100


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init(key: jax.Array) -> dict[str, jax.Array | list[jax.Array]]:
    keys = jax.random.split(key, BLOCKS + 2)
    blocks = []
    for index in range(BLOCKS):
        blocks.append(jax.random.normal(keys[index], (WIDTH, WIDTH)) / WIDTH**0.5)
        print(f"block {index + 1} of {BLOCKS} initialised", flush=True)
    return {
        "w_in": jax.random.normal(keys[-2], (FEATURES, WIDTH)) / FEATURES**0.5,
        "blocks": blocks,
        "w_out": jax.random.normal(keys[-1], (WIDTH, CLASSES)) / WIDTH**0.5,
    }


def loss_fn(params, x: jax.Array, y: jax.Array) -> jax.Array:
    h = x @ params["w_in"]
    for weight in params["blocks"]:
        h = h + jax.nn.gelu(h @ weight)
    logits = h @ params["w_out"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])


@jax.jit
def train_step(params, x: jax.Array, y: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    key = jax.random.PRNGKey(0)
    params = init(key)
    for step in range(1, STEPS + 1):
        key, kx, ky = jax.random.split(key, 3)
        x = jax.random.normal(kx, (BATCH, FEATURES))
        y = jax.random.randint(ky, (BATCH,), 0, CLASSES)
        params, loss = train_step(params, x, y)
        if step % 10 == 0:
            print(f"step {step}: loss {float(loss):.3f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
