"""Train a deep residual MLP on tabular credit-risk data with a jitted JAX step that keeps
every block's intermediates for the backward pass, where rematerialising each block
(`jax.checkpoint`) would keep only its input.

Each applicant is 256 numeric features; the model is 24 pre-norm residual blocks (layer
norm, a 256 -> 1024 expansion, GELU, a 1024 -> 256 projection), 6.3 million weights,
24 MiB, trained with a donated momentum-SGD step on batches of 8192 applicants. The
weights, the momentum and a step's gradients are about 75 MiB. But XLA compiles the
forward and the backward pass into one program and plans all of its buffers at once:
for the backward it keeps every block's normalised input and its 1024-wide pre-activation
(8 MiB and 32 MiB for the batch) alive from the forward pass, over a GiB of temporaries for
24 blocks, against 640 MiB of memory, so the first call of the step runs out. (Wrap each
block in `jax.checkpoint`: only the 8 MiB block inputs are kept, 192 MiB for 24 blocks,
each block's intermediates are recomputed in its backward, and it trains under the same
cap.)
"""

from __future__ import annotations

import resource
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
FEATURES, WIDTH, BLOCKS, BATCH, STEPS, MOMENTUM = 256, 1024, 24, 8192, 60, 0.9


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init_params(key: jax.Array) -> dict:
    keys = jax.random.split(key, 2 * BLOCKS + 1)
    blocks = [
        {
            "scale": jnp.ones(FEATURES),
            "expand": jax.random.normal(keys[2 * i], (FEATURES, WIDTH)) / FEATURES**0.5,
            "project": jax.random.normal(keys[2 * i + 1], (WIDTH, FEATURES)) / WIDTH**0.5 / BLOCKS,
        }
        for i in range(BLOCKS)
    ]
    return {"blocks": blocks, "head": jax.random.normal(keys[-1], (FEATURES,)) / FEATURES**0.5}


def block_apply(block: dict, hidden: jax.Array) -> jax.Array:
    normed = hidden * jax.lax.rsqrt(jnp.mean(hidden**2, axis=-1, keepdims=True) + 1e-6)
    return hidden + jax.nn.gelu((normed * block["scale"]) @ block["expand"]) @ block["project"]


def logits(params: dict, features: jax.Array) -> jax.Array:
    hidden = features
    for block in params["blocks"]:
        hidden = block_apply(block, hidden)  # BUG: every block's intermediates kept for backward
    return hidden @ params["head"]


def loss_fn(params: dict, features: jax.Array, defaulted: jax.Array) -> jax.Array:
    scores = logits(params, features)
    return jnp.mean(jnp.logaddexp(0.0, scores) - defaulted * scores)


@partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, velocity, features, defaulted):
    loss, grads = jax.value_and_grad(loss_fn)(params, features, defaulted)
    velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - 1e-2 * v, params, velocity)
    return params, velocity, loss


def make_batch(rng: np.random.Generator, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for applicants' records: default risk follows a few of the features."""
    features = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
    risk = features[:, :16] @ weights
    return features, (rng.random(BATCH) < 1 / (1 + np.exp(-risk))).astype(np.float32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(16).astype(np.float32) / 2
    params = init_params(jax.random.PRNGKey(0))
    velocity = jax.tree.map(jnp.zeros_like, params)
    count = sum(leaf.size for leaf in jax.tree.leaves(params))
    print(f"{count / 1e6:.1f}M weights, {4 * count >> 20} MiB", flush=True)
    for step in range(1, STEPS + 1):
        params, velocity, loss = train_step(params, velocity, *make_batch(rng, weights))
        if step % 10 == 0:
            print(f"step {step}: loss {float(loss):.4f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
