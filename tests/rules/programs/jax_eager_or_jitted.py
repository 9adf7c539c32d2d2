"""JAX on CPU (dispatch made synchronous, so an error surfaces in the call that made it),
under an address-space cap 768 MiB above what the process maps after JAX starts; a jitted
step trains 10 times, then:

MODE=eager: one eager broadcast whose 1 GiB result does not fit.
MODE=jit: a jitted function of the program whose 3 GiB output does not fit."""

import os
import resource

import jax
import jax.numpy as jnp

jax.config.update("jax_cpu_enable_async_dispatch", False)
jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (768 << 20), hard))


@jax.jit
def train_step(w, x):
    return w - 0.01 * jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)


@jax.jit
def pairwise(p):
    return p[:, None, :] - p[None, :, :]


w, x = jnp.ones((64, 64)), jnp.ones((32, 64))
for _ in range(10):
    w = train_step(w, x)
points = jnp.ones((16384, 3))
if os.environ.get("MODE", "eager") == "eager":
    print(jnp.broadcast_to(points[:, :1], (16384, 16384)).sum())
else:
    print(pairwise(points).sum())
