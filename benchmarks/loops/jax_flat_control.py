"""Train an MLP classifier in JAX with a jitted step: a run with no memory problem.

The same cap as the other programs, a batch that fits with room to spare, nothing kept
from step to step but the parameters and a running loss (a Python float). Memory rises
while the step compiles and then stays flat; the run finishes.
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
FEATURES, HIDDEN, CLASSES = 256, 512, 10
BATCH, STEPS = 128, 300


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / FEATURES**0.5,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) / HIDDEN**0.5,
    }


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    logits = jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])


@jax.jit
def train_step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)
    params = init(jax.random.PRNGKey(0))
    running = 0.0
    for step in range(1, STEPS + 1):
        y = rng.integers(0, CLASSES, BATCH)
        x = centers[y] + rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
        params, loss = train_step(params, x, y)
        running += float(loss)
        if step % 50 == 0:
            print(f"step {step}: mean loss {running / 50:.3f}", flush=True)
            running = 0.0
    print("training finished")


if __name__ == "__main__":
    main()
