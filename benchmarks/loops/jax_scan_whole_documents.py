"""Train a byte-level language model built on a diagonal linear recurrence in JAX,
backpropagating through each whole 8192-byte document in one jitted step.

The layer is h_t = a * h_{t-1} + (1 - a) * x_t W_in, with a per-channel decay `a`, and
y_t = gelu(h_t) W_out predicts the next byte; `jax.lax.scan` runs the recurrence. The
weights are tiny (under 1 MiB), but the gradient of a scan needs what every step saved,
and the step's other tensors grow with the length too: for a batch of 8 documents the
projected inputs, the stacked states, their GELU and its gradient are each 8 x 8192 x 512
floats, 128 MiB, next to 64 MiB tensors of logits and log-probabilities. Taking whole
documents instead of windows puts more than the whole memory among the jitted step's XLA
temporaries, and the first step runs out. (Truncated backpropagation, windows of 1024
bytes with the state carried from one window to the next, needs an eighth of that and
trains under the same cap.)
"""

from __future__ import annotations

import functools
import resource

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 384 << 20  # as on a machine with 384 MiB to spare
BYTES, EMBED, HIDDEN, DOCUMENTS, BATCH, STEPS = 256, 64, 512, 64, 8, 40
LENGTH = 8192  # BUG: whole documents; the step's working set grows with the length
LEARNING_RATE, MOMENTUM = 0.05, 0.9


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
        "embed": jax.random.normal(k1, (BYTES, EMBED)) * 0.1,
        "w_in": jax.random.normal(k2, (EMBED, HIDDEN)) / EMBED**0.5,
        "decay": jnp.linspace(0.0, 6.0, HIDDEN),  # a = sigmoid(decay): short to long memory
        "w_out": jax.random.normal(k3, (HIDDEN, BYTES)) / HIDDEN**0.5,
        "b_out": jnp.zeros(BYTES),
    }


def mean_loss(params: dict[str, jax.Array], documents: jax.Array) -> jax.Array:
    inputs, targets = documents[:, :-1], documents[:, 1:]
    decay = jax.nn.sigmoid(params["decay"])
    driven = (1 - decay) * (params["embed"][inputs] @ params["w_in"])  # (batch, time, hidden)

    def advance(state: jax.Array, drive: jax.Array) -> tuple[jax.Array, jax.Array]:
        state = decay * state + drive
        return state, state

    start = jnp.zeros((documents.shape[0], HIDDEN))
    _, states = jax.lax.scan(advance, start, jnp.swapaxes(driven, 0, 1))
    logits = jax.nn.gelu(jnp.swapaxes(states, 0, 1)) @ params["w_out"] + params["b_out"]
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, velocity, documents):
    loss, grads = jax.value_and_grad(mean_loss)(params, documents)
    velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - LEARNING_RATE * v, params, velocity)
    return params, velocity, loss


def make_documents(rng: np.random.Generator) -> np.ndarray:
    """Stands in for long text files: runs of repeated words over a small alphabet."""
    words = rng.integers(97, 123, (512, 6))
    picks = rng.integers(0, len(words), (DOCUMENTS, (LENGTH + 1) // 7 + 1))
    spaced = np.concatenate([words[picks], np.full((*picks.shape, 1), 32)], axis=2)
    return spaced.reshape(DOCUMENTS, -1)[:, : LENGTH + 1].astype(np.int32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    documents = make_documents(rng)
    params = init(jax.random.PRNGKey(0))
    velocity = jax.tree.map(jnp.zeros_like, params)
    running = 0.0
    for step in range(1, STEPS + 1):
        batch = documents[rng.choice(DOCUMENTS, BATCH, replace=False)]
        params, velocity, loss = train_step(params, velocity, batch)
        running += float(loss)  # read every step, so that a failed step reports at once
        if step % 5 == 0:
            print(f"step {step}: mean loss {running / 5:.3f}", flush=True)
            running = 0.0
    print("training finished")


if __name__ == "__main__":
    main()
