"""Train a click-through-rate model in JAX with a jitted step and a hand-written Adam whose
step does not donate its inputs.

The model hashes each impression's categorical features into a table of 2^20 buckets of 32
floats (128 MiB), pools them and scores the impression with a small MLP. Between steps the
program holds the parameters and Adam's two moments, three copies of the table: 384 MiB,
which fit. `train_step` is jitted without `donate_argnums`, so XLA cannot write the new
parameters and moments into the buffers of the old ones: the compiled step must hold its
inputs and its outputs at once, six copies of the table and the gradient beside them
(896 MiB), more than the memory there is, and the first step runs out. (With
`donate_argnums=(0, 1)` the outputs reuse the inputs' buffers, and the same steps train
under the same cap.)
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 704 << 20  # as on a machine with 704 MiB to spare
BUCKETS, DIM, HIDDEN, FIELDS, BATCH, STEPS = 1 << 20, 32, 256, 24, 512, 60
LEARNING_RATE, BETA1, BETA2, EPSILON = 1e-3, 0.9, 0.999, 1e-8


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
        "table": jax.random.normal(k1, (BUCKETS, DIM)) * 0.01,
        "w1": jax.random.normal(k2, (DIM, HIDDEN)) / DIM**0.5,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k3, (HIDDEN,)) / HIDDEN**0.5,
    }


def loss_fn(params: dict[str, jax.Array], buckets: jax.Array, clicked: jax.Array) -> jax.Array:
    pooled = params["table"][buckets].mean(axis=1)  # (batch, DIM)
    logit = jax.nn.relu(pooled @ params["w1"] + params["b1"]) @ params["w2"]
    return jnp.mean(jax.nn.softplus(logit) - clicked * logit)  # binary cross-entropy


# BUG: no donate_argnums, so the step holds the old and the new parameters and moments
@jax.jit
def train_step(params, moments, count, buckets, clicked):
    loss, grads = jax.value_and_grad(loss_fn)(params, buckets, clicked)
    first, second = moments
    first = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, first, grads)
    second = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, second, grads)
    scale = LEARNING_RATE * jnp.sqrt(1 - BETA2**count) / (1 - BETA1**count)
    params = jax.tree.map(
        lambda p, m, v: p - scale * m / (jnp.sqrt(v) + EPSILON), params, first, second
    )
    return params, (first, second), loss


def make_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for hashed impression logs: a few buckets make a click more likely."""
    buckets = rng.integers(0, BUCKETS, (BATCH, FIELDS), dtype=np.int32)
    clicked = (buckets[:, 0] % 7 == 0) | (rng.random(BATCH) < 0.05)
    return buckets, clicked.astype(np.float32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    params = init(jax.random.PRNGKey(0))
    moments = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    running = 0.0
    for step in range(1, STEPS + 1):
        buckets, clicked = make_batch(rng)
        params, moments, loss = train_step(params, moments, step, buckets, clicked)
        running += float(loss)
        if step % 20 == 0:
            print(f"step {step}: mean loss {running / 20:.4f}", flush=True)
            running = 0.0
    print("training finished")


if __name__ == "__main__":
    main()
