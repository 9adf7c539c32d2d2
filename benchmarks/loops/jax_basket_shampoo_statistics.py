"""Train a next-basket recommender for a grocery shop in JAX with a hand-written Shampoo
optimizer, whose full-matrix preconditioners for the two product-sized weight matrices are
far larger than the model.

The model reads a basket as a multi-hot vector over 8192 products, averages their
256-dimensional embeddings (an 8192 x 256 table, 8 MiB), passes the result through a
hidden layer of 512, and scores all 8192 products for the next purchase (a 512 x 8192
output matrix, 16 MiB): 6.4 million weights, 24 MiB. The optimizer is Shampoo (Gupta et
al., 2018) with AdaGrad grafting, written by hand: for every weight matrix of m x n it
keeps a left statistic (m x m) and a right one (n x n), accumulated from G G^T and G^T G,
and their inverse fourth roots, recomputed every 20 steps. For the embedding table the
left ones are 8192 x 8192, and for the output matrix the right ones: four matrices of
256 MiB, 1 GiB of optimizer state for a 24 MiB model, against 768 MiB of memory. It runs
out while creating the statistics, before the first jitted step, though the model, its
gradients and a batch's activations take under 100 MiB. (Blocked Shampoo, which splits
every dimension over 1024 into blocks of 1024 with a preconditioner each, keeps eight
1024 x 1024 blocks, 32 MiB, in place of each 8192 x 8192 matrix, 128 MiB in all, and
trains under the same cap.)
"""

from __future__ import annotations

import resource
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
PRODUCTS, EMBED, HIDDEN, BASKET, AISLES = 8192, 256, 512, 12, 64
BATCH, STEPS, ROOT_EVERY = 256, 200, 20
LEARNING_RATE, EPSILON = 1e-2, 1e-6


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "embed": 0.05 * jax.random.normal(k1, (PRODUCTS, EMBED)),
        "hidden": jax.random.normal(k2, (EMBED, HIDDEN)) / EMBED**0.5,
        "hidden_bias": jnp.zeros(HIDDEN),
        "out": jax.random.normal(k3, (HIDDEN, PRODUCTS)) / HIDDEN**0.5,
        "out_bias": jnp.zeros(PRODUCTS),
    }


def loss_fn(params, baskets, next_items):
    sizes = baskets.sum(axis=1, keepdims=True)
    pooled = baskets @ params["embed"] / sizes
    hidden = jax.nn.gelu(pooled @ params["hidden"] + params["hidden_bias"])
    logits = hidden @ params["out"] + params["out_bias"]
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, next_items[:, None], axis=1))


def init_shampoo(params):
    """Full-matrix statistics and their inverse roots for matrices, AdaGrad for vectors."""

    def for_weight(weight):
        if weight.ndim == 1:
            return {"graft": jnp.zeros_like(weight)}
        rows, columns = weight.shape
        return {
            "left": EPSILON * jnp.eye(rows),
            "right": EPSILON * jnp.eye(columns),
            "left_root": jnp.eye(rows),
            "right_root": jnp.eye(columns),
            "graft": jnp.zeros_like(weight),
        }

    return {name: for_weight(weight) for name, weight in params.items()}


def shampoo_direction(grad, slot):
    graft = slot["graft"] + grad * grad
    adagrad = grad / (jnp.sqrt(graft) + EPSILON)
    if grad.ndim == 1:
        return adagrad, {"graft": graft}
    left = slot["left"] + grad @ grad.T
    right = slot["right"] + grad.T @ grad
    shampoo = slot["left_root"] @ grad @ slot["right_root"]
    direction = shampoo * jnp.linalg.norm(adagrad) / (jnp.linalg.norm(shampoo) + EPSILON)
    return direction, {**slot, "left": left, "right": right, "graft": graft}


@partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, slots, baskets, next_items):
    loss, grads = jax.value_and_grad(loss_fn)(params, baskets, next_items)
    new_params, new_slots = {}, {}
    for name, grad in grads.items():
        direction, new_slots[name] = shampoo_direction(grad, slots[name])
        new_params[name] = params[name] - LEARNING_RATE * direction
    return new_params, new_slots, loss


@jax.jit
def inverse_fourth_root(statistic):
    values, vectors = jnp.linalg.eigh(statistic)
    return (vectors * jnp.maximum(values, EPSILON) ** -0.25) @ vectors.T


def refresh_roots(slots):
    for slot in slots.values():
        if "left" in slot:
            slot["left_root"] = inverse_fourth_root(slot["left"])
            slot["right_root"] = inverse_fourth_root(slot["right"])
    return slots


def make_baskets(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for till receipts: a basket mostly keeps to a few aisles of 128 products,
    and the next purchase comes from the same aisles."""
    aisles = rng.integers(0, AISLES, (BATCH, 2))
    picks = rng.integers(0, 2, (BATCH, BASKET + 1))
    chosen = np.take_along_axis(aisles, picks, axis=1) * (PRODUCTS // AISLES)
    items = chosen + rng.integers(0, PRODUCTS // AISLES, (BATCH, BASKET + 1))
    baskets = np.zeros((BATCH, PRODUCTS), np.float32)
    np.put_along_axis(baskets, items[:, :BASKET], 1.0, axis=1)
    return baskets, items[:, BASKET].astype(np.int32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    params = init_params(jax.random.PRNGKey(0))
    weights = sum(p.size for p in params.values())
    print(f"{weights / 1e6:.1f}M weights ({weights * 4 >> 20} MiB)", flush=True)
    slots = init_shampoo(params)
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(slots))
    print(f"Shampoo state {state_bytes >> 20} MiB", flush=True)
    for step in range(1, STEPS + 1):
        params, slots, loss = train_step(params, slots, *make_baskets(rng))
        if step % ROOT_EVERY == 0:
            slots = refresh_roots(slots)
        if step % 10 == 0:
            print(f"step {step}: loss {float(loss):.4f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
