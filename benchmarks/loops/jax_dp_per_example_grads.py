"""Train a digit classifier with differentially private SGD in JAX, whose jitted step takes
the gradient of every example of the batch at once to clip it.

DP-SGD clips each example's gradient to a norm of 1 before the batch's gradients are
summed and noised, so the step computes per-example gradients with
`jax.vmap(jax.grad(loss))`. The MLP has 1.9 million parameters (7.1 MiB); with a batch of
256, the compiled step materialises a whole gradient for each example, 256 copies of the
model (1.8 GiB) among XLA's temporaries, to take their norms and scale them: 1.9 GB
requested at once. That is far more than the memory there is, and the first step runs
out, though the parameters, the batch and the plain (not per-example) gradient need a few
dozen MiB. (Clip in micro-batches of 16 examples, a jitted call each that returns their
clipped sum, and add the sums up between calls: 16 copies, 114 MiB, are live at once, and
the steps train under the same cap.)
"""

from __future__ import annotations

import resource

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
PIXELS, HIDDEN, CLASSES, BATCH, STEPS = 784, 1024, 10, 256, 40
LEARNING_RATE, CLIP_NORM, NOISE_MULTIPLIER = 0.1, 1.0, 1.1


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
        "w1": jax.random.normal(k1, (PIXELS, HIDDEN)) / PIXELS**0.5,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, HIDDEN)) / HIDDEN**0.5,
        "b2": jnp.zeros(HIDDEN),
        "w3": jax.random.normal(k3, (HIDDEN, CLASSES)) / HIDDEN**0.5,
        "b3": jnp.zeros(CLASSES),
    }


def example_loss(params: dict[str, jax.Array], image: jax.Array, label: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(image @ params["w1"] + params["b1"])
    hidden = jax.nn.relu(hidden @ params["w2"] + params["b2"])
    logits = hidden @ params["w3"] + params["b3"]
    return jax.nn.logsumexp(logits) - logits[label]


def clipped(grads: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """One example's gradient, scaled down to a norm of at most CLIP_NORM."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    return jax.tree.map(lambda g: g * jnp.minimum(1.0, CLIP_NORM / (norm + 1e-6)), grads)


@jax.jit
def train_step(params, images, labels, key):
    # BUG: one gradient per example for the whole batch at once (256 model copies)
    per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(params, images, labels)
    per_example = jax.vmap(clipped)(per_example)
    leaves, structure = jax.tree.flatten(jax.tree.map(lambda g: g.sum(axis=0), per_example))
    keys = jax.random.split(key, len(leaves))
    noised = jax.tree.unflatten(
        structure,
        [
            (g + NOISE_MULTIPLIER * CLIP_NORM * jax.random.normal(k, g.shape)) / BATCH
            for g, k in zip(leaves, keys, strict=True)
        ],
    )
    params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, noised)
    loss = jnp.mean(jax.vmap(example_loss, in_axes=(None, 0, 0))(params, images, labels))
    return params, loss


def make_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for handwritten digits: each class lights up its own band of pixels."""
    labels = rng.integers(0, CLASSES, BATCH)
    images = rng.random((BATCH, PIXELS), dtype=np.float32) * 0.3
    band = PIXELS // CLASSES
    for row, label in enumerate(labels):
        images[row, label * band : (label + 1) * band] += 0.7
    return images, labels.astype(np.int32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    key = jax.random.PRNGKey(0)
    params = init(key)
    running = 0.0
    for step in range(1, STEPS + 1):
        images, labels = make_batch(rng)
        key, noise_key = jax.random.split(key)
        params, loss = train_step(params, images, labels, noise_key)
        running += float(loss)
        if step % 10 == 0:
            print(f"step {step}: mean loss {running / 10:.4f}", flush=True)
            running = 0.0
    print("training finished")


if __name__ == "__main__":
    main()
