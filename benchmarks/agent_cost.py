"""What `memdoc run`'s agent adds to the program it watches: address space, resident memory
and threads, per framework, with and without an address-space cap.

A small real program per framework (a few training steps) prints its own VmPeak, VmSize,
VmHWM and thread count from /proc/self/status; it runs plainly and under `memdoc run`,
alternated, and each figure is the median over rounds of the difference. Address space is
what an address-space cap (RLIMIT_AS, `ulimit -v`) counts: every thread a process starts
reserves its stack and, in glibc, usually a malloc arena of 64 MiB.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import (
    Context,
    Figure,
    Target,
    child_env,
    last_line,
    memdoc_cmd,
    run_timed,
    summarise,
    unavailable,
)

MIB = 1 << 20
CAP_BYTES = 32 << 30  # far above what the programs use: only the presence of a cap counts
FRAMEWORKS = ("torch", "jax", "tensorflow")
MARK = "AGENT-COST "
# The agent's budget in a process under a cap.
ADDRESS_TARGET = Target(16, "≤ 16 MiB")
RESIDENT_TARGET = Target(8, "≤ 8 MiB")

PROGRAM = """
import json, sys, time

STEPS = 5


def torch_steps():
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(torch.randn(64, 256)).square().mean().backward()
        optimizer.step()


def jax_steps():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(w, x):
        return w - 0.01 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)

    w, x = jnp.ones((256, 10)), jnp.ones((64, 256))
    for _ in range(STEPS):
        w = step(w, x)
    w.block_until_ready()


def tensorflow_steps():
    import numpy as np
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((256,)), tf.keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((64 * STEPS, 256), "float32"), np.ones((64 * STEPS, 10), "float32")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)


{"torch": torch_steps, "jax": jax_steps, "tensorflow": tensorflow_steps}[sys.argv[1]]()
time.sleep(0.3)  # a sampler interval or three: whatever memdoc starts is running by now
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
kib = {k: int(status[k].split()[0]) for k in ("VmPeak", "VmSize", "VmHWM", "VmRSS")}
print("AGENT-COST " + json.dumps({**kib, "Threads": int(status["Threads"])}), flush=True)
"""


def agent_cost_group(ctx: Context) -> list[Figure]:
    program = ctx.workdir / "agent_cost_program.py"
    program.write_text(PROGRAM)
    rounds = ctx.pick(1, 3)
    figures: list[Figure] = []
    for framework in FRAMEWORKS:
        for capped in (True, False):
            ctx.log(f"{framework}, {'under a cap' if capped else 'no cap'}: {rounds} round(s)")
            figures += _framework_figures(ctx, program, framework, capped, rounds)
    return figures


def _framework_figures(
    ctx: Context, program: Path, framework: str, capped: bool, rounds: int
) -> list[Figure]:
    deltas: dict[str, list[float]] = {"VmPeak": [], "VmHWM": [], "Threads": []}
    for index in range(rounds):
        try:
            plain = measure(program, framework, ctx.workdir, capped=capped)
            watched = measure(
                program, framework, ctx.workdir, capped=capped, trace=f"{framework}-{index}"
            )
        except RuntimeError as exc:
            return [unavailable(f"agent.{framework}", f"{framework} agent cost", "MiB", str(exc))]
        for name, values in deltas.items():
            values.append(watched[name] - plain[name])
    return _summaries(framework, capped, deltas)


def _summaries(framework: str, capped: bool, deltas: dict[str, list[float]]) -> list[Figure]:
    where = "under a cap" if capped else "no cap"
    key = f"agent.{framework}.{'capped' if capped else 'uncapped'}"
    mib = {name: [v / 1024 for v in values] for name, values in deltas.items()}
    return [
        summarise(
            f"{key}.address",
            f"{framework}, {where}: address space added (VmPeak)",
            mib["VmPeak"],
            "MiB",
            target=ADDRESS_TARGET if capped else None,
        ),
        summarise(
            f"{key}.resident",
            f"{framework}, {where}: resident added (VmHWM)",
            mib["VmHWM"],
            "MiB",
            target=RESIDENT_TARGET if capped else None,
        ),
        summarise(f"{key}.threads", f"{framework}, {where}: threads added", deltas["Threads"], ""),
    ]


def measure(
    program: Path, framework: str, workdir: Path, *, capped: bool, trace: str | None = None
) -> dict[str, int]:
    """The program's own /proc/self/status figures (KiB, threads), plainly or under memdoc.

    Raises:
        RuntimeError: the program failed or printed no figures (the framework is missing).
    """
    cmd: list[str] = [sys.executable, str(program), framework]
    if trace is not None:
        cmd = [
            *memdoc_cmd("run", "-q", "--force", "-o", str(workdir / f"{trace}.memdoc")),
            *cmd[1:],
        ]
    prefix = ["prlimit", f"--as={CAP_BYTES}"] if capped else []
    _, done = run_timed([*prefix, *cmd], cwd=workdir, timeout_s=300, env=child_env())
    return parse_figures(done.stdout, done.returncode, done.stderr)


def parse_figures(stdout: bytes, returncode: int, stderr: bytes) -> dict[str, int]:
    for line in stdout.decode(errors="replace").splitlines():
        if line.startswith(MARK):
            figures: dict[str, int] = json.loads(line[len(MARK) :])
            return figures
    raise RuntimeError(f"exit {returncode}: {last_line(stderr)}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.agent_cost`: this group alone."""
    import tempfile

    from benchmarks.__main__ import table

    quick = "--quick" in (argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="memdoc-agent-cost-") as scratch:
        figures = agent_cost_group(Context(quick=quick, workdir=Path(scratch)))
    print(table(figures))
    return 1 if any(f.status == "OVER" for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
