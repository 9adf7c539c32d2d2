"""Train an MLP regressor in JAX with a jitted, donated momentum-SGD step that keeps the last
six checkpoints in host memory to roll back to when the loss turns into NaN: a run with no
memory problem, whose memory climbs for the first half of training.

The model maps 512 sensor readings to 256 targets through two hidden layers of 2048
(5.5 million weights, 22 MiB); with the momentum buffer the training state is 44 MiB.
Every 30 steps the loop copies the state to the host with `jax.device_get` and appends it
to a `collections.deque(maxlen=6)`; if a step's loss is not finite, it restores the oldest
copy and halves the learning rate. For the first 180 steps each copy adds 44 MiB, a rise
in steps as a slow leak would show; from then on each new copy pushes out the oldest, and
memory stays flat at about 264 MiB of copies until the 360th step. Nothing else is kept
between steps, it all fits with room to spare, and the run finishes.
"""

from __future__ import annotations

import collections
import itertools
import resource
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
SIZES = (512, 2048, 2048, 256)
BATCH, STEPS, EVERY, KEEP, MOMENTUM = 128, 360, 30, 6, 0.9


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


def predict(params, readings):
    hidden = readings
    for layer in params[:-1]:
        hidden = jax.nn.gelu(hidden @ layer["w"] + layer["b"])
    return hidden @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, readings, targets):
    return jnp.mean((predict(params, readings) - targets) ** 2)


@partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, velocity, readings, targets, learning_rate):
    loss, grads = jax.value_and_grad(loss_fn)(params, readings, targets)
    velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - learning_rate * v, params, velocity)
    return params, velocity, loss


def make_batch(rng: np.random.Generator, mixing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for sensor logs: the targets are a smooth function of the readings."""
    readings = rng.standard_normal((BATCH, SIZES[0]), dtype=np.float32)
    return readings, np.tanh(readings @ mixing)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    mixing = rng.standard_normal((SIZES[0], SIZES[-1]), dtype=np.float32) / SIZES[0] ** 0.5
    params = init_params(jax.random.PRNGKey(0))
    velocity = jax.tree.map(jnp.zeros_like, params)
    learning_rate = 1e-3
    checkpoints: collections.deque = collections.deque(maxlen=KEEP)  # the last six, on the host
    for step in range(1, STEPS + 1):
        params, velocity, loss = train_step(
            params, velocity, *make_batch(rng, mixing), learning_rate
        )
        if not np.isfinite(float(loss)) and checkpoints:
            restored_step, host_params, host_velocity = checkpoints[0]
            params, velocity = jax.device_put(host_params), jax.device_put(host_velocity)
            learning_rate /= 2
            print(f"step {step}: loss not finite, back to step {restored_step}", flush=True)
        if step % EVERY == 0:
            checkpoints.append((step, *jax.device_get((params, velocity))))
            print(
                f"step {step}: loss {float(loss):.4f}, {len(checkpoints)} checkpoints", flush=True
            )
    print("training finished")


if __name__ == "__main__":
    main()
