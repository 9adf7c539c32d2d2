"""`--metrics-port` / `--serve`: start the Prometheus exporter beside a command, stop it after."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from memdoc.metrics.identity import JobIdentity

if TYPE_CHECKING:
    from prometheus_client.registry import Collector


@contextmanager
def serving_metrics(args: argparse.Namespace, trace: Path, identity: JobIdentity) -> Iterator[None]:
    """Serve the metrics of the trace `memdoc run` writes, while the block runs."""
    if args.metrics_port is None:
        yield
        return
    from memdoc.metrics.families import MemdocCollector
    from memdoc.metrics.sources import TraceFileSource

    collector = MemdocCollector(TraceFileSource(trace), identity)
    with exporting(collector, args.metrics_port, args.metrics_address, quiet=args.quiet):
        yield


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
