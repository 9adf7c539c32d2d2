"""`--metrics-port` / `--serve`: start the Prometheus exporter beside a command, stop it after."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from memdoc.metrics.identity import JobIdentity

# How long `memdoc run` keeps serving once the program ended: a scraper then sees
# `memdoc_running 0` and the final findings. `--metrics-grace` changes it.
METRICS_GRACE_S = 5.0


@contextmanager
def serving_metrics(args: argparse.Namespace, trace: Path, identity: JobIdentity) -> Iterator[None]:
    """Serve the metrics of the trace `memdoc run` writes, while the block runs and for
    `args.metrics_grace` seconds after it ended."""
    if args.metrics_port is None:
        yield
        return
    from memdoc.metrics.families import MemdocCollector
    from memdoc.metrics.sources import TraceFileSource

    collector = MemdocCollector(TraceFileSource(trace), identity)
    with exporting(collector, args.metrics_port, args.metrics_address, quiet=args.quiet):
        yield
        _linger(args.metrics_grace)


@contextmanager
def exporting(collector: Collector, port: int, address: str, *, quiet: bool) -> Iterator[None]:
    """Serve one collector on `address:port` while the block runs, and say where."""
    from memdoc.metrics.server import serve

    server = serve(collector, port, address)
    if not quiet:
        print(f"memdoc: Prometheus metrics at {server.url}", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        server.stop()


def _linger(grace_s: float) -> None:
    """Wait `grace_s` with the exporter still up; Ctrl-C ends the wait."""
    if grace_s <= 0:
        return
    with suppress(KeyboardInterrupt):
        time.sleep(grace_s)
