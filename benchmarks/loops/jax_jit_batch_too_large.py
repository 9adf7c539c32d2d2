"""Train an MLP on small images in JAX with a jitted step and a batch far too big.

The batch of 65536 flattened 16x16x3 images was chosen for throughput. One step of the
compiled program (the normalised inputs, two hidden layers saved for the backward pass,
their gradients) needs more than twice the memory there is, and the first step runs out.
A batch of 4096 trains.
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
FEATURES, HIDDEN, CLASSES = 16 * 16 * 3, 1024, 10
BATCH, STEPS = 65536, 30


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


def loss_fn(params: dict[str, jax.Array], images: jax.Array, y: jax.Array) -> jax.Array:
    x = images.astype(jnp.float32) / 255.0
    h = jax.nn.gelu(x @ params["w1"])
    h = jax.nn.gelu(h @ params["w2"])
    logits = h @ params["w3"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])


@jax.jit
def train_step(params: dict[str, jax.Array], images: jax.Array, y: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(params, images, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def load_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for the input pipeline: uint8 images and their labels."""
    rng = np.random.default_rng(step)
    images = rng.integers(0, 256, (BATCH, FEATURES), dtype=np.uint8)
    return images, rng.integers(0, CLASSES, BATCH)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    params = init(jax.random.PRNGKey(0))
    for step in range(1, STEPS + 1):
        images, labels = load_batch(step)
        params, loss = train_step(params, images, labels)
        print(f"step {step}: loss {float(loss):.3f}", flush=True)


if __name__ == "__main__":
    main()
