"""A jitted JAX step with a hand-written Adam over a 64 MiB embedding table, under an
address-space cap BUDGET_MIB (default 160) above what the process maps once the parameters
and moments (192 MiB) exist.

DONATE=0 (default): `jax.jit(train_step)` without `donate_argnums`: the compiled step holds
the old and the new parameters and moments at once (384 MiB) and its first call runs out.
DONATE=1: `donate_argnums=(0, 1)`, the new state written into the old one's buffers; with
BUDGET_MIB=48 the step still runs out, on the table's 64 MiB gradient: the state is too
large for the memory, donated or not."""

import os
import resource

import jax
import jax.numpy as jnp

ROWS, DIM, BATCH = 1 << 19, 32, 256
# Each computation runs to its end on the calling thread, as on one GPU stream: the error
# comes out of the call that failed.
jax.config.update("jax_cpu_enable_async_dispatch", False)


def loss_fn(params, ids, target):
    pooled = params["table"][ids].mean(axis=1)
    return ((pooled @ params["head"] - target) ** 2).mean()


def train_step(params, moments, ids, target):
    grads = jax.grad(loss_fn)(params, ids, target)
    first, second = moments
    first = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, first, grads)
    second = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, second, grads)
    params = jax.tree.map(
        lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), params, first, second
    )
    return params, (first, second)


donate = os.environ.get("DONATE", "0") == "1"
step = jax.jit(train_step, donate_argnums=(0, 1) if donate else ())
key = jax.random.PRNGKey(0)
params = {"table": jax.random.normal(key, (ROWS, DIM)), "head": jnp.ones((DIM, 1))}
moments = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
ids = jax.random.randint(key, (BATCH, 16), 0, ROWS)
target = jnp.ones((BATCH, 1))
jax.block_until_ready((params, moments))
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
budget = int(os.environ.get("BUDGET_MIB", "160")) << 20
resource.setrlimit(resource.RLIMIT_AS, (mapped + budget, hard))
for _ in range(20):
    params, moments = step(params, moments, ids, target)
jax.block_until_ready(params)
print("trained")
