"""Train a small JAX embedding model with a jitted step, then score retrieval eagerly.

Training is fine. After it, a retrieval metric compares every query embedding with every
entry of the memory bank by broadcasting `queries[:, None, :] - bank[None, :, :]`: one
eager array of 4096 x 65536 x 64 floats (64 GiB), far more than the machine could ever
give, in a single request. (`queries @ bank.T` with the norms gives the same distances.)
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
FEATURES, HIDDEN, EMBED = 128, 256, 64
BATCH, STEPS, QUERIES, BANK = 256, 60, 4096, 65536


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
        "w2": jax.random.normal(k2, (HIDDEN, EMBED)) / HIDDEN**0.5,
    }


def embed(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def loss_fn(params: dict[str, jax.Array], anchors: jax.Array, positives: jax.Array) -> jax.Array:
    a, p = embed(params, anchors), embed(params, positives)
    logits = a @ p.T
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(a)), jnp.arange(len(a))])


@jax.jit
def train_step(params: dict[str, jax.Array], anchors: jax.Array, positives: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(params, anchors, positives)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    key = jax.random.PRNGKey(0)
    params = init(key)
    for step in range(1, STEPS + 1):
        key, k1, k2 = jax.random.split(key, 3)
        anchors = jax.random.normal(k1, (BATCH, FEATURES))
        positives = anchors + jax.random.normal(k2, (BATCH, FEATURES))
        params, loss = train_step(params, anchors, positives)
        if step % 20 == 0:
            print(f"step {step}: loss {float(loss):.3f}", flush=True)

    key, k1, k2 = jax.random.split(key, 3)
    queries = embed(params, jax.random.normal(k1, (QUERIES, FEATURES)))
    bank = embed(params, jax.random.normal(k2, (BANK, FEATURES)))
    distances = jnp.sum((queries[:, None, :] - bank[None, :, :]) ** 2, axis=-1)  # BUG: 64 GiB
    nearest = jnp.argmin(distances, axis=1)
    print(f"retrieval done: {int(nearest[0])}")


if __name__ == "__main__":
    main()
