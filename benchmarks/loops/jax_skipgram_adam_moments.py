"""Train skip-gram word vectors in JAX with a jitted, donated step and Adam from
`jax.example_libraries.optimizers`, whose two moments per weight leave no room for the
step's gradient.

The vocabulary has 500,000 words, and the model two tables of 500,000 x 64 floats (the
word vectors and the context vectors, 122 MiB each, 244 MiB). Each step scores 4096
(word, context) pairs from a window of five and five sampled negatives per pair. In JAX
the gradient of a table lookup is a dense table, so the step needs a full gradient of
both tables (244 MiB) beside what is held between steps. With plain SGD that is 244 MiB of
weights plus 244 MiB of gradient, and the step, jitted with the optimizer state donated,
fits easily. The author chose Adam: `opt_init` keeps, besides the weights, a first and a
second moment of both tables (488 MiB more), so 732 MiB is held between steps, and the first
step, which must add the 244 MiB gradient to that, runs out. (SGD, or SGD with momentum at
one moment, trains under the same cap; or Adam on the small parts and SGD on the tables.)
"""

from __future__ import annotations

import resource
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.example_libraries import optimizers

BUDGET_BYTES = 896 << 20  # as on a machine with 896 MiB to spare
VOCAB, DIM, CORPUS, BATCH, WINDOW, NEGATIVES, STEPS = 500_000, 64, 2_000_000, 4096, 5, 5, 200


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_corpus(rng: np.random.Generator) -> np.ndarray:
    """Stands in for a tokenised text: word ids drawn from a Zipf distribution."""
    return np.minimum(rng.zipf(1.1, CORPUS) - 1, VOCAB - 1).astype(np.int32)


def sample_pairs(corpus: np.ndarray, rng: np.random.Generator):
    positions = rng.integers(WINDOW, len(corpus) - WINDOW, BATCH)
    offsets = rng.integers(1, WINDOW + 1, BATCH) * rng.choice([-1, 1], BATCH)
    negatives = rng.integers(0, VOCAB, (BATCH, NEGATIVES), dtype=np.int32)
    return corpus[positions], corpus[positions + offsets], negatives


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    return {  # as word2vec starts them
        "words": jax.random.uniform(key, (VOCAB, DIM), minval=-0.5, maxval=0.5) / DIM,
        "contexts": jnp.zeros((VOCAB, DIM)),
    }


def loss_fn(params, words, contexts, negatives):
    word = params["words"][words]  # (batch, DIM)
    positive = jnp.sum(word * params["contexts"][contexts], axis=-1)
    negative = jnp.einsum("bd,bkd->bk", word, params["contexts"][negatives])
    return -jnp.mean(jax.nn.log_sigmoid(positive) + jax.nn.log_sigmoid(-negative).sum(-1))


opt_init, opt_update, get_params = optimizers.adam(1e-3)  # BUG: two moments of both tables


@partial(jax.jit, donate_argnums=(1,))
def train_step(step, opt_state, words, contexts, negatives):
    loss, grads = jax.value_and_grad(loss_fn)(get_params(opt_state), words, contexts, negatives)
    return opt_update(step, grads, opt_state), loss


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    corpus = make_corpus(rng)
    params = init_params(jax.random.PRNGKey(0))
    print(f"{VOCAB} words, {sum(p.nbytes for p in params.values()) >> 20} MiB of vectors")
    opt_state = opt_init(params)
    del params
    running = 0.0
    for step in range(STEPS):
        opt_state, loss = train_step(step, opt_state, *sample_pairs(corpus, rng))
        running += float(loss)
        if (step + 1) % 20 == 0:
            print(f"step {step + 1}: mean loss {running / 20:.4f}", flush=True)
            running = 0.0
    print("training finished")


if __name__ == "__main__":
    main()
