"""Train a deep residual MLP on tabular credit-risk data with a jitted JAX step that keeps
every block's intermediates for the backward pass, where rematerialising each block
(`jax.checkpoint`) would keep only its input.

Each applicant is 256 numeric features; the model is 24 pre-norm residual blocks (RMS
norm, a 256 -> 1024 expansion, GELU, a 1024 -> 256 projection), 12.6 million weights,
48 MiB, stacked and applied with `jax.lax.scan` so that one block is compiled, and
trained with a donated momentum-SGD step on batches of 8192 applicants. The weights, the
momentum and a step's gradients are about 150 MiB. But XLA compiles the forward and the
backward pass into one program and plans all of its buffers at once: for the backward the
scan stacks every block's residuals from the forward pass (its 1024-wide pre-activation
and GELU output, 32 MiB each for the batch, and more), and the step asks for one 5.4 GiB
block of temporaries against 1 GiB of memory, so its first call runs out. (Scan
`jax.checkpoint(block_apply)` instead: only the 8 MiB block inputs are kept, each block's
intermediates are recomputed in its backward, the temporaries come to 385 MiB, and it
trains under the same cap.)
"""

from __future__ import annotations

import resource
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
FEATURES, WIDTH, BLOCKS, BATCH, STEPS, MOMENTUM = 256, 1024, 24, 8192, 30, 0.9


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init_params(key: jax.Array) -> dict:
    """The 24 blocks' weights stacked along a leading axis, for `jax.lax.scan`."""
    keys = jax.random.split(key, 3)
    return {
        "blocks": {
            "scale": jnp.ones((BLOCKS, FEATURES)),
            "expand": jax.random.normal(keys[0], (BLOCKS, FEATURES, WIDTH)) / FEATURES**0.5,
            "project": jax.random.normal(keys[1], (BLOCKS, WIDTH, FEATURES)) / WIDTH**0.5 / BLOCKS,
        },
        "head": jax.random.normal(keys[2], (FEATURES,)) / FEATURES**0.5,
    }


def block_apply(hidden: jax.Array, block: dict) -> tuple[jax.Array, None]:
    normed = hidden * jax.lax.rsqrt(jnp.mean(hidden**2, axis=-1, keepdims=True) + 1e-6)
    update = jax.nn.gelu((normed * block["scale"]) @ block["expand"]) @ block["project"]
    return hidden + update, None


def logits(params: dict, features: jax.Array) -> jax.Array:
    # one compiled block applied 24 times; BUG: every block's intermediates kept for backward
    hidden, _ = jax.lax.scan(block_apply, features, params["blocks"])
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
    losses = []
    for step in range(1, STEPS + 1):
        params, velocity, loss = train_step(params, velocity, *make_batch(rng, weights))
        losses.append(float(loss))
        if step % 10 == 0:
            print(f"step {step}: mean loss {np.mean(losses[-10:]):.4f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
