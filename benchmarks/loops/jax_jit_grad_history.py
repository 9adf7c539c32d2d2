"""Train an MLP classifier in JAX with a jitted step, keeping every step's gradients.

The step returns the gradients as well, and the loop appends them to `grad_history` for a
gradient-noise estimate at the end of the epoch. Each entry is the size of the model (about
6 MiB), so memory grows by one model a step until it runs out after some dozens of steps.
(Keep running sums of the gradient and its square instead.)
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
FEATURES, HIDDEN, CLASSES = 256, 1024, 10
BATCH, STEPS = 128, 400


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / FEATURES**0.5,
        "w2": jax.random.normal(k2, (HIDDEN, HIDDEN)) / HIDDEN**0.5,
        "w3": jax.random.normal(k3, (HIDDEN, CLASSES)) / HIDDEN**0.5,
    }


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"])
    h = jax.nn.relu(h @ params["w2"])
    logits = h @ params["w3"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])


@jax.jit
def train_step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    return params, loss, grads


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    key = jax.random.PRNGKey(0)
    params = init(key)
    grad_history = []
    for step in range(1, STEPS + 1):
        key, kx, ky = jax.random.split(key, 3)
        x = jax.random.normal(kx, (BATCH, FEATURES))
        y = jax.random.randint(ky, (BATCH,), 0, CLASSES)
        params, loss, grads = train_step(params, x, y)
        grad_history.append(grads)  # BUG: one model-sized copy of the gradients per step
        if step % 10 == 0:
            print(f"step {step}: loss {float(loss):.3f}", flush=True)
    mean = jax.tree.map(lambda *g: jnp.mean(jnp.stack(g), 0), *grad_history)
    print(f"mean gradient norm {float(jnp.linalg.norm(mean['w2'])):.4f}")


if __name__ == "__main__":
    main()
