"""The measured program: a small PyTorch MLP doing real Adam steps on CPU, under a chosen monitor.

Run as a script (`python benchmarks/workload.py --steps 1000 --result r.json`), alone, under
`memdoc run`, or with an in-program monitor (`--mode watch|psutil|stormlog`). It times the
training loop from inside, so interpreter start and imports are not counted, and writes
`{"loop_s": ..., "steps": ...}` to `--result`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

WARMUP_STEPS = 20


def build(seed: int) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(64, 256)
    labels = torch.randint(0, 10, (64,))
    return model, optimizer, inputs, labels


def train(parts: tuple[Any, Any, Any, Any], steps: int) -> float:
    model, optimizer, inputs, labels = parts
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return float(loss.item())


@contextlib.contextmanager
def psutil_poller(interval_s: float) -> Iterator[None]:
    """What people write by hand: a thread reading this process's RSS every interval."""
    import psutil

    process = psutil.Process()
    readings: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(interval_s):
            readings.append(process.memory_info().rss)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def stormlog_tracker() -> Iterator[None]:
    """Stormlog's tracker at its defaults; on a machine without a GPU that is its CPU tracker."""
    from stormlog import CPUMemoryTracker  # type: ignore[import-untyped]

    tracker = CPUMemoryTracker()
    tracker.start_tracking()
    try:
        yield
    finally:
        tracker.stop_tracking()


def monitor(
    mode: str, interval_s: float | None, trace: Path | None
) -> contextlib.AbstractContextManager[Any]:
    if mode == "plain":
        return contextlib.nullcontext()
    if mode == "watch":
        import memdoc

        path = trace if trace is not None else Path("watch.memdoc")
        if interval_s is None:
            return memdoc.watch(path)
        return memdoc.watch(path, interval=interval_s)
    if mode == "psutil":
        return psutil_poller(interval_s if interval_s is not None else 0.1)
    if mode == "stormlog":
        return stormlog_tracker()
    raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seconds", type=float, help="train for this long instead of --steps")
    parser.add_argument("--mode", default="plain", choices=["plain", "watch", "psutil", "stormlog"])
    parser.add_argument("--interval", type=float)
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    parts = build(seed=0)
    steps = 0
    with monitor(args.mode, args.interval, args.trace):
        train(parts, WARMUP_STEPS)
        start = time.perf_counter()
        if args.seconds is not None:
            while time.perf_counter() - start < args.seconds:
                train(parts, 50)
                steps += 50
        else:
            train(parts, args.steps)
            steps = args.steps
        loop_s = time.perf_counter() - start
    if args.result is not None:
        args.result.write_text(json.dumps({"loop_s": loop_s, "steps": steps, "mode": args.mode}))


if __name__ == "__main__":
    main()
