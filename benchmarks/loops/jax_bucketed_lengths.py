"""Train a small sequence classifier in JAX with a jitted step on sentences padded to a few
bucket lengths: a run with no memory problem.

Sentences have any length from 8 to 256 tokens; a batch holds sentences of similar length
and is padded to the next of eight bucket lengths, so the jitted step is compiled once per
bucket (eight programs) and then reused. Memory rises in the first steps, while the
buckets are first seen and compiled, then stays flat: the cache of compiled steps is
bounded by the number of buckets and the run has room for it. Nothing else is kept
between steps; the run finishes.
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
VOCAB, DIM, HIDDEN, CLASSES, BATCH, STEPS = 8000, 64, 128, 5, 32, 240
BUCKETS = (32, 64, 96, 128, 160, 192, 224, 256)


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
        "embed": jax.random.normal(k1, (VOCAB, DIM)) * 0.1,
        "w1": jax.random.normal(k2, (DIM, HIDDEN)) / DIM**0.5,
        "w2": jax.random.normal(k3, (HIDDEN, CLASSES)) / HIDDEN**0.5,
    }


def loss_fn(params, tokens: jax.Array, mask: jax.Array, labels: jax.Array) -> jax.Array:
    hidden = jax.nn.gelu(params["embed"][tokens] @ params["w1"])  # (batch, length, HIDDEN)
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    logits = pooled @ params["w2"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(labels)), labels])


@jax.jit
def train_step(params, velocity, tokens, mask, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, mask, labels)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - 0.05 * v, params, velocity)
    return params, velocity, loss


def make_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch of sentences of similar lengths (as a length-grouped sampler gives), padded
    to the bucket of the longest."""
    labels = rng.integers(0, CLASSES, BATCH)
    typical = rng.integers(8, BUCKETS[-1] - 7)
    lengths = typical + rng.integers(0, 8, BATCH)
    width = next(bucket for bucket in BUCKETS if bucket >= lengths.max())
    tokens = rng.integers(0, VOCAB, (BATCH, width))
    tokens[:, ::4] = labels[:, None] * (VOCAB // CLASSES) + rng.integers(0, 50, (BATCH, 1))
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float32)
    return tokens * mask.astype(np.int64), mask, labels


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    params = init(jax.random.PRNGKey(0))
    velocity = jax.tree.map(jnp.zeros_like, params)
    seen: set[int] = set()
    running = 0.0
    for step in range(1, STEPS + 1):
        tokens, mask, labels = make_batch(rng)
        if tokens.shape[1] not in seen:
            seen.add(tokens.shape[1])
            print(f"step {step}: first batch of length {tokens.shape[1]}", flush=True)
        params, velocity, loss = train_step(params, velocity, tokens, mask, labels)
        running += float(loss)
        if step % 50 == 0:
            print(f"step {step}: mean loss {running / 50:.3f}", flush=True)
            running = 0.0
    print("training finished")


if __name__ == "__main__":
    main()
