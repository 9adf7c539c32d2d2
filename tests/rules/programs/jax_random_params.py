"""JAX on the CPU under an address-space cap 256 MiB above what the process maps once JAX
has started, drawing its parameters with `jax.random.normal` in its own `init`, layer by
layer (8 layers of 4096 x 4096 float32: 512 MiB):

MODE=params: the parameters are drawn before any step, and do not fit.
MODE=noise: small parameters train 5 jitted steps, then one batch of noise drawn with
jax.random.normal does not fit: drawn after steps, not parameters being built."""

import os
import resource

import jax
import jax.numpy as jnp

jax.config.update("jax_cpu_enable_async_dispatch", False)
jnp.ones(1).block_until_ready()
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20), hard))
PARAMS = os.environ.get("MODE", "params") == "params"


def init(key: jax.Array, width: int, layers: int) -> list[jax.Array]:
    keys = jax.random.split(key, layers)
    return [jax.random.normal(k, (width, width)) / width**0.5 for k in keys]


@jax.jit
def train_step(params: list[jax.Array], x: jax.Array) -> list[jax.Array]:
    def loss(params: list[jax.Array]) -> jax.Array:
        h = x
        for w in params:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    return [p - 0.01 * g for p, g in zip(params, jax.grad(loss)(params), strict=True)]


key = jax.random.PRNGKey(0)
params = init(key, 4096 if PARAMS else 64, 8)
x = jnp.ones((32, 64))
for _ in range(5):
    params = train_step(params, x)
noise = jax.random.normal(key, (32768, 4096))
print(float(noise.sum()))
