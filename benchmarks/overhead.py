"""How much slower a training loop runs watched: memdoc run, memdoc.watch, and the alternatives."""

from __future__ import annotations

import importlib.util
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import (
    BENCHMARKS_DIR,
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

WORKLOAD = BENCHMARKS_DIR / "workload.py"
ONE_PERCENT = Target(1.0, "≤ 1%")


@dataclass(frozen=True)
class Variant:
    """One way of running the same loop."""

    name: str
    title: str
    mode: str = "plain"  # the in-program monitor
    under_memdoc_run: bool = False
    interval_s: float | None = None  # None: the tool's default
    target: Target | None = None
    needs: str | None = None  # a module that must be importable

    def command(self, steps: int, trace: Path, result: Path) -> list[str]:
        program = [str(WORKLOAD), "--steps", str(steps), "--result", str(result)]
        program += ["--mode", self.mode]
        if self.interval_s is not None and not self.under_memdoc_run:
            program += ["--interval", str(self.interval_s)]
        if self.mode == "watch":
            program += ["--trace", str(trace)]
        if not self.under_memdoc_run:
            return [sys.executable, *program]
        options = ["run", "-o", str(trace)]
        if self.interval_s is not None:
            options += ["--interval", str(self.interval_s)]
        return memdoc_cmd(*options, *program)


VARIANTS = (
    Variant("plain", "plain run (baseline)"),
    Variant("run", "memdoc run, default interval", under_memdoc_run=True, target=ONE_PERCENT),
    Variant("run-0.01", "memdoc run --interval 0.01", under_memdoc_run=True, interval_s=0.01),
    Variant("watch", "memdoc.watch, default interval", mode="watch", target=ONE_PERCENT),
    Variant("watch-0.01", "memdoc.watch(interval=0.01)", mode="watch", interval_s=0.01),
    Variant("psutil", "psutil RSS polling thread, 0.1 s", mode="psutil", interval_s=0.1),
    Variant("stormlog", "Stormlog tracker, defaults", mode="stormlog", needs="stormlog"),
)


@dataclass
class Outcome:
    loop_s: float
    total_s: float


def run_once(variant: Variant, ctx: Context, steps: int, index: int) -> Outcome | str:
    """One run; the outcome, or the reason it failed."""
    folder = ctx.workdir / "overhead" / f"{variant.name}-{index}"
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "result.json"
    cmd = variant.command(steps, folder / "t.memdoc", result)
    total_s, done = run_timed(cmd, cwd=folder, timeout_s=600, env=child_env())
    if done.returncode != 0 or not result.exists():
        return f"exit {done.returncode}: {last_line(done.stderr)}"
    loop_s = float(json.loads(result.read_text())["loop_s"])
    return Outcome(loop_s, total_s)


def overhead_group(ctx: Context) -> list[Figure]:
    steps = ctx.pick(300, 1200)
    rounds = ctx.pick(1, 5)
    variants = [v for v in VARIANTS if v.needs is None or importlib.util.find_spec(v.needs)]
    missing = [v for v in VARIANTS if v not in variants]
    outcomes: dict[str, list[Outcome | str]] = {v.name: [] for v in variants}
    rng = random.Random(ctx.seed)
    for round_index in range(rounds):
        order = list(variants)
        rng.shuffle(order)  # alternate: drift on a shared machine hits every variant alike
        for variant in order:
            ctx.log(f"overhead round {round_index + 1}/{rounds}: {variant.name}")
            outcomes[variant.name].append(run_once(variant, ctx, steps, round_index))
    figures = _figures(outcomes, variants, steps)
    figures += [
        unavailable(f"overhead.{v.name}.loop", v.title, "%", f"{v.needs} is not installed")
        for v in missing
    ]
    return figures


def _figures(
    outcomes: dict[str, list[Outcome | str]], variants: list[Variant], steps: int
) -> list[Figure]:
    base = outcomes["plain"]
    good_base = [o for o in base if isinstance(o, Outcome)]
    if not good_base:
        return [unavailable("overhead.plain", "plain run", "s", f"the plain run failed: {base[0]}")]
    figures = [
        summarise(
            "overhead.plain.loop",
            f"plain loop: {steps} Adam steps, 1 thread",
            [o.loop_s for o in good_base],
            "s",
            note=f"{steps / statistics.median(o.loop_s for o in good_base):.0f} steps/s",
        )
    ]
    for variant in variants[1:]:
        figures += _variant_figures(variant, base, outcomes[variant.name])
    return figures


def _variant_figures(
    variant: Variant, base: list[Outcome | str], runs: list[Outcome | str]
) -> list[Figure]:
    key = f"overhead.{variant.name}"
    failures = [r for r in runs if isinstance(r, str)]
    # Paired by round: each ratio compares runs made back to back.
    pairs = [
        (b, r)
        for b, r in zip(base, runs, strict=True)
        if isinstance(b, Outcome) and isinstance(r, Outcome)
    ]
    if not pairs:
        reason = failures[0] if failures else "no run"
        return [unavailable(f"{key}.loop", variant.title, "%", reason, variant.target)]
    loop = [100.0 * (r.loop_s / b.loop_s - 1.0) for b, r in pairs]
    # Contention only ever slows a run down: the best runs are the least disturbed ones.
    best = 100.0 * (min(r.loop_s for _, r in pairs) / min(b.loop_s for b, _ in pairs) - 1.0)
    note = f"best against best {best:+.1f}%" if len(pairs) > 1 else ""
    if failures:
        note += f"; {len(failures)} run(s) failed: {failures[0]}"
    added = [r.total_s - b.total_s for b, r in pairs]
    return [
        summarise(
            f"{key}.loop",
            f"{variant.title}: loop slowdown",
            loop,
            "%",
            target=variant.target,
            note=note,
        ),
        summarise(f"{key}.total", f"{variant.title}: added wall time, start to exit", added, "s"),
    ]
