"""The trace on disk: bytes per value, write throughput, and the time to load a million values."""

from __future__ import annotations

import time

from benchmarks.harness import Context, Figure, Target, summarise
from benchmarks.synthetic import million_value_trace
from memdoc.trace import load_trace


def trace_group(ctx: Context) -> list[Figure]:
    ctx.log("writing a one-million-value trace")
    path, values, write_s = million_value_trace(ctx.workdir, ctx.shared)
    size = path.stat().st_size
    loads = []
    for _ in range(ctx.pick(1, 3)):
        start = time.perf_counter()
        trace = load_trace(path)
        loads.append(time.perf_counter() - start)
        assert trace.values_read == values, "the trace did not read back whole"
    return [
        summarise(
            "trace.bytes_per_value",
            "bytes on disk per recorded value",
            [size / values],
            "B",
            target=Target(40.0, "≤ 40 B"),
            note=f"{values:,} values in {size / 1e6:.1f} MB, all records included",
        ),
        summarise(
            "trace.write_rate", "write throughput (TraceWriter)", [values / write_s], "values/s"
        ),
        summarise(
            "trace.load_1m",
            "load a one-million-value trace",
            loads,
            "s",
            target=Target(2.0, "< 2 s"),
        ),
    ]
