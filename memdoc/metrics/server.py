"""Serve the metrics over HTTP with prometheus-client's own server, on loopback by default."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from memdoc.errors import MemdocError

DEFAULT_ADDRESS = "127.0.0.1"
MAX_PORT = 65535


@dataclass
class MetricsServer:
    """A running exporter: where it listens, and how to stop it."""

    address: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(2.0)


def serve(collector: Collector, port: int, address: str = DEFAULT_ADDRESS) -> MetricsServer:
    """Expose one collector, and nothing else, on `address:port` (port 0: any free port).

    The registry is memdoc's own: no process or platform metrics of memdoc itself, which
    would be mistaken for the program's. prometheus-client's server answers GET (any path:
    the exposition), OPTIONS, and 405 to every other method; it writes nothing.

    Raises:
        MemdocError: the port is out of range or taken, or the address is not this machine's.
    """
    if not 0 <= port <= MAX_PORT:
        raise MemdocError(f"metrics port {port} is not a port (0 to {MAX_PORT})")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise MemdocError(
            f"cannot serve metrics on {address}:{port} ({exc.strerror or exc})",
            hint="choose another port (0 takes any free one), or an address this machine has",
        ) from None
    thread.name = "memdoc-metrics"
    return MetricsServer(address, int(server.server_port), server, thread)
