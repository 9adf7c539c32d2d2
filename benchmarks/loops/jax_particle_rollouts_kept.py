"""Train a learned particle simulator in JAX with a jitted multi-step rollout loss
(`jax.lax.scan`), keeping every step's predicted and true rollouts for an animation of
training progress at the end.

Each training example is a scene of 1024 particles (2D position and velocity) pulled
together by springs towards their centre, under gravity and damping, bouncing on a floor.
The model, an MLP of two hidden layers of 64 units (about 4,600 weights), predicts each
particle's acceleration from its offset from the centre and its velocity, and the step
integrates it for 32 time steps with `jax.lax.scan`, comparing the predicted trajectory
with the true one: a batch of 8 scenes, a jitted and donated momentum-SGD step whose scan
body is wrapped in `jax.checkpoint`, so its temporaries (the 32 states and one time step's
recomputation) take a few dozen MiB and are freed after it. The step also returns the
predicted rollout, and the loop appends it, with the true rollout, to `rollouts` "to
animate how the predictions improve": two (32, 8, 1024, 4) float32 arrays, 8 MiB a step,
never released. Memory grows by 8 MiB a step until it runs out after about a hundred of
the 400 steps under 768 MiB, though the model and its momentum take a few dozen KiB.
(Keep the rollout of one fixed scene every 20 steps, 0.5 MiB each, or write the frames to
disk: it trains under the same cap.)
"""

from __future__ import annotations

import itertools
import resource
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
SCENES, PARTICLES, HORIZON, STEPS = 8, 1024, 32, 400
SIZES = (4, 64, 64, 2)
DT, STIFFNESS, DAMPING, GRAVITY = 0.02, 4.0, 0.3, -9.8
LEARNING_RATE, MOMENTUM = 1e-3, 0.9


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def integrate(state: jax.Array, acceleration: jax.Array) -> jax.Array:
    """Semi-implicit Euler with an inelastic floor at y = 0."""
    position, velocity = state[..., :2], state[..., 2:]
    velocity = velocity + DT * acceleration
    position = position + DT * velocity
    below = position[..., 1:2] < 0
    position = position.at[..., 1:2].set(jnp.abs(position[..., 1:2]))
    velocity = velocity.at[..., 1:2].set(jnp.where(below, -0.5, 1.0) * velocity[..., 1:2])
    return jnp.concatenate([position, velocity], axis=-1)


def features(state: jax.Array) -> jax.Array:
    position, velocity = state[..., :2], state[..., 2:]
    offset = position - position.mean(axis=-2, keepdims=True)
    return jnp.concatenate([offset, velocity], axis=-1)


@jax.jit
def simulate(start: jax.Array) -> jax.Array:
    """The true physics: springs to the centre, gravity and damping."""

    def step(state, _):
        offset, velocity = jnp.split(features(state), 2, axis=-1)
        acceleration = -STIFFNESS * offset - DAMPING * velocity + jnp.array([0.0, GRAVITY])
        state = integrate(state, acceleration)
        return state, state

    return jax.lax.scan(step, start, None, length=HORIZON)[1]


def init_params(key: jax.Array) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(key, len(SIZES) - 1)
    return [
        {
            "w": jax.random.normal(keys[i], (fan_in, fan_out)) * (1.0 / fan_in) ** 0.5,
            "b": jnp.zeros(fan_out),
        }
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(SIZES))
    ]


def predict_acceleration(params, state: jax.Array) -> jax.Array:
    hidden = features(state)
    for layer in params[:-1]:
        hidden = jax.nn.gelu(hidden @ layer["w"] + layer["b"])
    return 10.0 * (hidden @ params[-1]["w"] + params[-1]["b"])


def rollout_loss(params, start: jax.Array, target: jax.Array):
    @jax.checkpoint  # keep only each time step's state for backward, recompute the rest
    def step(state, _):
        state = integrate(state, predict_acceleration(params, state))
        return state, state

    rollout = jax.lax.scan(step, start, None, length=HORIZON)[1]
    return jnp.mean((rollout - target) ** 2), rollout


@partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, velocity, start, target):
    (loss, rollout), grads = jax.value_and_grad(rollout_loss, has_aux=True)(params, start, target)
    velocity = jax.tree.map(lambda v, g: MOMENTUM * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - LEARNING_RATE * v, params, velocity)
    return params, velocity, loss, rollout


def make_scenes(rng: np.random.Generator) -> np.ndarray:
    """Stands in for sampled initial conditions: a blob of particles dropped from a height."""
    centre = rng.uniform([-1.0, 1.0], [1.0, 3.0], (SCENES, 1, 2))
    position = centre + 0.3 * rng.standard_normal((SCENES, PARTICLES, 2))
    velocity = 0.5 * rng.standard_normal((SCENES, PARTICLES, 2))
    return np.concatenate([position, velocity], axis=-1).astype(np.float32)


def main() -> None:
    # Each computation runs to its end on the calling thread, as on one GPU stream: on the
    # CPU, a failed allocation in an asynchronous dispatch can otherwise hang the program.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    jnp.ones(1).block_until_ready()  # start JAX's CPU client before the cap: its threads count
    cap_address_space(BUDGET_BYTES)
    rng = np.random.default_rng(0)
    params = init_params(jax.random.PRNGKey(0))
    velocity = jax.tree.map(jnp.zeros_like, params)
    rollouts = []  # for an animation of training progress at the end
    for step in range(1, STEPS + 1):
        start = jnp.asarray(make_scenes(rng))
        target = simulate(start)
        params, velocity, loss, rollout = train_step(params, velocity, start, target)
        rollouts.append((rollout, target))  # BUG: 8 MiB of rollouts kept every step
        if step % 10 == 0:
            print(f"step {step}: rollout loss {float(loss):.4f}", flush=True)
    print(f"training finished, {len(rollouts)} rollouts to animate")


if __name__ == "__main__":
    main()
