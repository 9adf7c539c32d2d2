"""A jitted JAX step that runs out of memory at a batch too large for an address-space cap,
and a program that catches the error and tries a quarter of the batch, as a hand-written
batch-size search does. The cyclic garbage collector is off, so that anything kept alive by
a reference cycle through the error stays alive: after the handler, the failed try's frame
(here, its `sentinel`) must be gone, as in a run without memdoc. Prints "freed" or "kept",
then "trained at N"."""

import gc
import os
import resource
import weakref

import jax
import jax.numpy as jnp

jax.config.update("jax_cpu_enable_async_dispatch", False)


class Sentinel:
    pass


@jax.jit
def train_step(w, x):
    grad = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.01 * grad


def attempt(w, batch, watch):
    sentinel = Sentinel()  # lives in this frame, which the error's traceback holds
    watch.append(weakref.ref(sentinel))
    x = jnp.ones((batch, 1024))
    return train_step(w, x)


def main() -> None:
    w = jnp.ones((1024, 1024)) * 1e-3
    jax.block_until_ready(attempt(w, 8, []))  # compiled and warm before the cap
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    budget = int(os.environ.get("BUDGET_MIB", "256")) << 20
    resource.setrlimit(resource.RLIMIT_AS, (mapped + budget, hard))
    gc.disable()
    batch, watch = 1 << 15, []
    try:
        jax.block_until_ready(attempt(w, batch, watch))
    except Exception as exc:  # noqa: BLE001 - XLA's RESOURCE_EXHAUSTED has no public type
        assert "RESOURCE_EXHAUSTED" in str(exc), exc
    print("kept" if watch[0]() is not None else "freed", flush=True)
    batch //= 4
    jax.block_until_ready(attempt(w, batch, []))
    print(f"trained at {batch}", flush=True)


if __name__ == "__main__":
    main()
