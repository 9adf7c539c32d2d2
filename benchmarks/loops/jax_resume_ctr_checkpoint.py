"""Resume a click-through-rate model's JAX training from its last checkpoint after the job
was preempted, the way the training script was written: build a fresh state, then read
the whole checkpoint into host memory, then copy it to the device.

The model hashes 26 categorical fields of an ad impression into one shared table of
2^20 x 32 embeddings (128 MiB) and scores their concatenation with a small MLP; it is
trained with a hand-written Adam, so the training state, weights and both moments, is
three copies of the table, 384 MiB, and a donated step adds the table's dense gradient
and a few temporaries, about 640 MiB at its peak. The restore is where it runs out: the
freshly initialised state (384 MiB) is still alive as the template while `np.load` reads
every array of the checkpoint into host memory (384 MiB more) and `jnp.asarray` copies
each one to the device (384 MiB more), over 1.1 GiB against 896 MiB of memory, before
the first resumed step. (Take the template's shapes from `jax.eval_shape` instead of
initialising a state, and move each array to the device as it is read from the lazily
loaded file, dropping its host copy: the restore then peaks at the state and one array,
about 512 MiB, and training resumes under the same cap.)

The checkpoint is written before the memory cap, from NumPy arrays: it stands in for the
file the preempted run left behind.
"""

from __future__ import annotations

import os
import resource
import tempfile
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 896 << 20  # as on a machine with 896 MiB to spare
BUCKETS, DIM, FIELDS, HIDDEN, BATCH, STEPS = 1 << 20, 32, 26, 256, 4096, 40
B1, B2, LEARNING_RATE = 0.9, 0.999, 1e-3


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    keys = jax.random.split(key, 3)
    return {
        "table": 0.01 * jax.random.normal(keys[0], (BUCKETS, DIM)),
        "hidden": jax.random.normal(keys[1], (FIELDS * DIM, HIDDEN)) / (FIELDS * DIM) ** 0.5,
        "out": jax.random.normal(keys[2], (HIDDEN,)) / HIDDEN**0.5,
    }


def init_state(key: jax.Array) -> dict:
    params = init_params(key)
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"params": params, "m": zeros, "v": jax.tree.map(jnp.zeros_like, params), "step": 0}


def loss_fn(params: dict, buckets: jax.Array, clicked: jax.Array) -> jax.Array:
    embedded = jnp.take(params["table"], buckets, axis=0).reshape(len(buckets), -1)
    scores = jax.nn.relu(embedded @ params["hidden"]) @ params["out"]
    return jnp.mean(jnp.logaddexp(0.0, scores) - clicked * scores)


@partial(jax.jit, donate_argnums=(0,))
def train_step(state: dict, buckets: jax.Array, clicked: jax.Array):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], buckets, clicked)
    step = state["step"] + 1
    m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, state["v"], grads)
    scale = LEARNING_RATE * jnp.sqrt(1 - B2**step) / (1 - B1**step)
    params = jax.tree.map(
        lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), state["params"], m, v
    )
    return {"params": params, "m": m, "v": v, "step": step}, loss


def write_checkpoint(path: Path, rng: np.random.Generator) -> None:
    """What the preempted run saved at its step 12,000: weights and Adam's moments."""
    arrays = {}
    for group in ("params", "m", "v"):
        scale = {"params": 0.01, "m": 1e-4, "v": 1e-8}[group]
        for name, shape in (("table", (BUCKETS, DIM)), ("hidden", (FIELDS * DIM, HIDDEN))):
            arrays[f"{group}/{name}"] = scale * rng.standard_normal(shape, dtype=np.float32)
        arrays[f"{group}/out"] = scale * rng.standard_normal(HIDDEN, dtype=np.float32)
    for name in ("table", "hidden", "out"):
        arrays[f"v/{name}"] = np.abs(arrays[f"v/{name}"])  # second moments are not negative
    np.savez(path, step=np.int32(12_000), **arrays)


def restore(path: Path, template: dict) -> dict:
    """Read the checkpoint and put it into a state shaped like `template`."""
    with np.load(path) as checkpoint:
        host = {name: checkpoint[name] for name in checkpoint.files}  # BUG: all of it at once
    state = {
        group: {name: jnp.asarray(host[f"{group}/{name}"]) for name in template[group]}
        for group in ("params", "m", "v")
    }
    state["step"] = int(host["step"])
    return state


def make_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for logged impressions: a few hashed values make a click likely."""
    buckets = rng.integers(0, BUCKETS, (BATCH, FIELDS), dtype=np.int32)
    clicked = (buckets[:, 0] % 7 == 0) | (rng.random(BATCH) < 0.03)
    return buckets, clicked.astype(np.float32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    rng = np.random.default_rng(0)
    path = Path(tempfile.gettempdir()) / f"ctr-checkpoint-{os.getpid()}.npz"
    write_checkpoint(path, rng)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    try:
        state = init_state(jax.random.PRNGKey(0))
        if path.exists():
            state = restore(path, state)
            print(f"resumed from step {state['step']}", flush=True)
    finally:
        path.unlink()
    for step in range(state["step"] + 1, state["step"] + STEPS + 1):
        state, loss = train_step(state, *make_batch(rng))
        if step % 10 == 0:
            print(f"step {step}: loss {float(loss):.4f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
