"""Train a seismic event classifier in JAX with a jitted, donated Adam step and a
checkpoint written every 32 steps by pickling the whole training state: a run with no
memory problem, whose memory jumps at every checkpoint and falls back.

Each example is a three-component spectrogram of a station's recording (3 x 32 x 32, 3072
features) labelled earthquake, quarry blast, landslide or noise. The model is an MLP with
hidden layers of 4096 and 2048 (21 million weights, 80 MiB), trained with a hand-written
Adam whose two moments make the state 240 MiB, at a batch of 64 from a jitted step that
donates the state. Every 32 steps the loop saves a checkpoint the simple way:
`pickle.dumps` of the state fetched to the host with `jax.device_get`, written to a file
that replaces the previous one. While it runs, the pickled bytes (240 MiB) sit next to the
state, so memory jumps by 150 to 250 MiB at each checkpoint, on top of the 600 MiB or so
the run holds, and falls back when the bytes are written and dropped: five spikes of the
same height over the 160 steps, nothing kept between them, all within the 1 GiB cap, and
the run finishes. (Writing each array to the file in turn would flatten the spikes; but
nothing here needs fixing.)
"""

from __future__ import annotations

import itertools
import os
import pickle
import resource
import tempfile
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
SIZES = (3072, 4096, 2048, 4)
BATCH, STEPS, EVERY = 64, 160, 32
LEARNING_RATE, BETA1, BETA2, EPSILON = 3e-4, 0.9, 0.999, 1e-8


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init_params(key: jax.Array) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(key, len(SIZES) - 1)
    return [
        {
            "w": jax.random.normal(keys[i], (fan_in, fan_out)) * (2.0 / fan_in) ** 0.5,
            "b": jnp.zeros(fan_out),
        }
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(SIZES))
    ]


def loss_fn(params, spectrograms, labels):
    hidden = spectrograms
    for layer in params[:-1]:
        hidden = jax.nn.relu(hidden @ layer["w"] + layer["b"])
    logits = hidden @ params[-1]["w"] + params[-1]["b"]
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


@partial(jax.jit, donate_argnums=(0,))
def train_step(state, spectrograms, labels):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], spectrograms, labels)
    step = state["step"] + 1
    first = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, state["first"], grads)
    second = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, state["second"], grads)
    scale = LEARNING_RATE * jnp.sqrt(1 - BETA2**step) / (1 - BETA1**step)
    params = jax.tree.map(
        lambda p, m, v: p - scale * m / (jnp.sqrt(v) + EPSILON), state["params"], first, second
    )
    return {"params": params, "first": first, "second": second, "step": step}, loss


def save_checkpoint(path: str, state) -> None:
    """The whole state, pickled in memory, then written over the previous checkpoint."""
    payload = pickle.dumps(jax.device_get(state), protocol=pickle.HIGHEST_PROTOCOL)
    with open(path + ".tmp", "wb") as file:
        file.write(payload)
    os.replace(path + ".tmp", path)


def make_batch(rng: np.random.Generator, templates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for station recordings: each event type has its own spectral shape."""
    labels = rng.integers(0, len(templates), BATCH)
    gain = rng.uniform(0.5, 2.0, (BATCH, 1)).astype(np.float32)
    noise = rng.standard_normal((BATCH, SIZES[0]), dtype=np.float32)
    return gain * templates[labels] + noise, labels.astype(np.int32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    templates = rng.standard_normal((SIZES[-1], SIZES[0]), dtype=np.float32)
    params = init_params(jax.random.PRNGKey(0))
    state = {
        "params": params,
        "first": jax.tree.map(jnp.zeros_like, params),
        "second": jax.tree.map(jnp.zeros_like, params),
        "step": jnp.zeros((), jnp.int32),
    }
    del params
    weights = sum(p.size for p in jax.tree.leaves(state["params"]))
    print(f"{weights / 1e6:.1f}M weights, state {3 * weights * 4 >> 20} MiB", flush=True)
    with tempfile.TemporaryDirectory(prefix="jax-seismic-") as directory:
        path = os.path.join(directory, "checkpoint.pkl")
        for step in range(1, STEPS + 1):
            state, loss = train_step(state, *make_batch(rng, templates))
            if step % 10 == 0:
                print(f"step {step}: loss {float(loss):.4f}", flush=True)
            if step % EVERY == 0:
                save_checkpoint(path, state)
                print(f"step {step}: checkpoint {os.path.getsize(path) >> 20} MiB", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
