"""Train a tabular classifier in JAX with early stopping: a run with no memory problem,
whose evaluations make memory jump.

A jitted, donated Adam step trains an MLP (1.3 million parameters, 5 MiB) on batches of 256
rows. Every 100 steps one jitted call scores the whole held-out set, 32768 rows at once:
its hidden activations, two of 32768 x 1024 floats (256 MiB), are XLA temporaries for the
length of that call, so memory jumps by a few hundred MiB at each evaluation and falls
back after it. When the held-out loss improves, the program keeps the parameters on the
host (`jax.device_get`), replacing the copy it had, so the best model costs one more copy
of the weights however many evaluations improve. Nothing grows from step to step or from
evaluation to evaluation, the highest evaluation stays well inside the memory, and the run
finishes.
"""

from __future__ import annotations

import functools
import resource

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
FEATURES, HIDDEN, CLASSES, BATCH, HELD, STEPS, EVERY = 256, 1024, 4, 256, 32768, 600, 100
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
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / FEATURES**0.5,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, HIDDEN)) / HIDDEN**0.5,
        "b2": jnp.zeros(HIDDEN),
        "w3": jax.random.normal(k3, (HIDDEN, CLASSES)) / HIDDEN**0.5,
        "b3": jnp.zeros(CLASSES),
    }


def mean_loss(params: dict[str, jax.Array], rows: jax.Array, labels: jax.Array) -> jax.Array:
    hidden = jax.nn.gelu(rows @ params["w1"] + params["b1"])
    hidden = jax.nn.gelu(hidden @ params["w2"] + params["b2"])
    logits = hidden @ params["w3"] + params["b3"]
    picked = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, moments, count, rows, labels):
    loss, grads = jax.value_and_grad(mean_loss)(params, rows, labels)
    first, second = moments
    first = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, first, grads)
    second = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, second, grads)
    scale = LEARNING_RATE * jnp.sqrt(1 - BETA2**count) / (1 - BETA1**count)
    params = jax.tree.map(
        lambda p, m, v: p - scale * m / (jnp.sqrt(v) + EPSILON), params, first, second
    )
    return params, (first, second), loss


evaluate = jax.jit(mean_loss)  # the whole held-out set in one call


def make_rows(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for a feature table: each class shifts its own block of columns."""
    labels = rng.integers(0, CLASSES, count).astype(np.int32)
    rows = rng.standard_normal((count, FEATURES), dtype=np.float32)
    block = FEATURES // CLASSES
    for label in range(CLASSES):
        rows[labels == label, label * block : (label + 1) * block] += 0.3
    return rows, labels


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    held_rows, held_labels = (jnp.asarray(part) for part in make_rows(rng, HELD))
    params = init(jax.random.PRNGKey(0))
    moments = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    best_loss, best_params, running = float("inf"), None, 0.0
    for step in range(1, STEPS + 1):
        rows, labels = make_rows(rng, BATCH)
        params, moments, loss = train_step(params, moments, step, rows, labels)
        running += float(loss)
        if step % EVERY == 0:
            held_loss = float(evaluate(params, held_rows, held_labels))
            if held_loss < best_loss:
                best_loss, best_params = held_loss, jax.device_get(params)  # replaces the copy
            print(
                f"step {step}: train loss {running / EVERY:.4f}, held-out {held_loss:.4f}",
                flush=True,
            )
            running = 0.0
    print(f"training finished, best held-out loss {best_loss:.4f} ({len(best_params)} arrays)")


if __name__ == "__main__":
    main()
