"""A jitted train step called 10 times an epoch for 2 epochs, a jitted eval step 3 times
after each epoch, a jitted init called once; the jitted functions keep their own API."""

from functools import partial

import jax
import jax.numpy as jnp


@jax.jit
def init(key):
    return jax.random.normal(key, (8, 4))


@jax.jit
def train_step(w, x):
    grad = jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)
    return w - 0.01 * grad


@partial(jax.jit, static_argnums=2)
def eval_step(w, x, scale):
    return jnp.sum(x @ w) * scale


class Model:
    @partial(jax.jit, static_argnums=0)
    def apply(self, w, x):  # a jitted method binds like the original
        return x @ w


w = init(jax.random.PRNGKey(0))
x = jnp.ones((16, 8))
for _epoch in range(2):
    for _ in range(10):
        w = train_step(w, x)
    for _ in range(3):
        eval_step(w, x, 2)
assert train_step.lower(w, x).compile() is not None
assert train_step.__name__ == "train_step", train_step.__name__
assert Model().apply(w, x).shape == (16, 4)
print("ok")
