"""Post-mortem costs on a one-million-value trace: `diagnose`, and the report's time and size."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import (
    Context,
    Figure,
    Target,
    last_line,
    memdoc_cmd,
    run_timed,
    summarise,
    unavailable,
)
from benchmarks.synthetic import million_value_trace
from memdoc.trace import load_trace

DIAGNOSE_TARGET = Target(1.0, "< 1 s")
REPORT_TIME_TARGET = Target(5.0, "< 5 s")
REPORT_SIZE_TARGET = Target(10.0, "< 10 MB")


def _optional(module: str, name: str) -> Callable[..., Any] | str:
    """A function of a part that may not be built yet, or the reason it is missing."""
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError as exc:
        return f"not available yet ({exc})"
    return found if callable(found) else f"not available yet ({module}.{name} is missing)"


def analysis_group(ctx: Context) -> list[Figure]:
    path = million_value_trace(ctx.workdir, ctx.shared)[0]
    return [*_diagnose(ctx, path), *_report(ctx, path)]


def _diagnose(ctx: Context, path: Any) -> list[Figure]:
    diagnose = _optional("memdoc.rules.engine", "diagnose")
    title = "diagnose a one-million-value trace (rules only)"
    if isinstance(diagnose, str):
        return [unavailable("diagnose.1m", title, "s", diagnose, DIAGNOSE_TARGET)]
    times = []
    found: list[Any] = []
    for _ in range(ctx.pick(1, 3)):
        trace = load_trace(path)
        start = time.perf_counter()
        found = diagnose(trace)
        times.append(time.perf_counter() - start)
    rules = ", ".join(getattr(f, "rule", "?") for f in found) or "none"
    return [
        summarise(
            "diagnose.1m", title, times, "s", target=DIAGNOSE_TARGET, note=f"findings: {rules}"
        )
    ]


def _report(ctx: Context, path: Any) -> list[Figure]:
    title = "HTML report of a one-million-value trace"
    if isinstance(_optional("memdoc.cli.report", "run"), str):
        write_report = _optional("memdoc.report.html", "write_report")
        if isinstance(write_report, str):
            return [
                unavailable("report.1m.time", title, "s", write_report, REPORT_TIME_TARGET),
                unavailable(
                    "report.1m.size", f"{title}: size", "MB", write_report, REPORT_SIZE_TARGET
                ),
            ]
        return _report_in_process(ctx, path, write_report, title)
    return _report_cli(ctx, path, title)


def _report_in_process(
    ctx: Context, path: Any, write_report: Callable[..., Any], title: str
) -> list[Figure]:
    times = []
    out = ctx.workdir / "million.html"
    for _ in range(ctx.pick(1, 3)):
        start = time.perf_counter()
        write_report([path], out, force=True)
        times.append(time.perf_counter() - start)
    note = "load + diagnose + render + write, in process (no `memdoc report` command yet)"
    return _report_figures(title, times, out.stat().st_size, note)


def _report_cli(ctx: Context, path: Any, title: str) -> list[Figure]:
    times = []
    out = ctx.workdir / "million.html"
    for _ in range(ctx.pick(1, 3)):
        seconds, done = run_timed(
            memdoc_cmd("report", str(path), "-o", str(out), "--force"),
            cwd=ctx.workdir,
            timeout_s=300,
        )
        if done.returncode != 0 or not out.exists():
            reason = f"memdoc report failed (exit {done.returncode}): {last_line(done.stderr)}"
            return [
                unavailable("report.1m.time", title, "s", reason, REPORT_TIME_TARGET),
                unavailable("report.1m.size", f"{title}: size", "MB", reason, REPORT_SIZE_TARGET),
            ]
        times.append(seconds)
    note = "`memdoc report` end to end: interpreter start, load, diagnose, render, write"
    return _report_figures(title, times, out.stat().st_size, note)


def _report_figures(title: str, times: list[float], size_bytes: int, note: str) -> list[Figure]:
    return [
        summarise("report.1m.time", title, times, "s", target=REPORT_TIME_TARGET, note=note),
        summarise(
            "report.1m.size",
            f"{title}: file size",
            [size_bytes / 1e6],
            "MB",
            target=REPORT_SIZE_TARGET,
        ),
    ]
