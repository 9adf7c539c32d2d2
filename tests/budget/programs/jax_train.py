"""JAX on the CPU: a jitted train step of an MLP (64 -> 4096 -> 64, plain gradient
descent) called 30 times, the batch size from argv (default 256).

LEAK=1: also keeps each step's hidden activations (4 MiB at 256 rows), computed outside
the jitted step for a "debug" plot: the live arrays grow every step."""

import os
import sys

import jax
import jax.numpy as jnp

STEPS = 30
BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 256
HIDDEN = 4096
LEAK = os.environ.get("LEAK") == "1"


def loss_of(params, x):
    w1, w2 = params
    hidden = jax.nn.relu(x @ w1)
    return jnp.mean((hidden @ w2 - x) ** 2)


@jax.jit
def train_step(params, key):
    x = jax.random.normal(key, (BATCH, 64))
    loss, grads = jax.value_and_grad(loss_of)(params, x)
    return [p - 1e-3 * g for p, g in zip(params, grads, strict=True)], loss, x


key_w1, key_w2, key_x = jax.random.split(jax.random.PRNGKey(0), 3)
params = [
    jax.random.normal(key_w1, (64, HIDDEN)) * 0.05,
    jax.random.normal(key_w2, (HIDDEN, 64)) * 0.05,
]
keys = jax.random.split(key_x, STEPS)
kept = []
for step in range(STEPS):
    params, loss, x = train_step(params, keys[step])
    loss.block_until_ready()
    if LEAK:
        kept.append(jax.nn.relu(x @ params[0]).block_until_ready())
print("trained", STEPS, "steps, loss", float(loss))
