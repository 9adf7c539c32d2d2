"""Serve the metrics over HTTP with prometheus-client's own application, on loopback by
default, with bounded time and threads per connection."""

from __future__ import annotations

import io
import socket
import sys
import threading
import time
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector, CollectorRegistry

from memdoc.errors import MemdocError
from memdoc.printable import printable

DEFAULT_ADDRESS = "127.0.0.1"
MAX_PORT = 65535
# A client has this long to send its whole request, and each later read or write may wait
# this long: an idle or slow connection is closed instead of holding a thread for ever.
REQUEST_TIMEOUT_S = 5.0
# Connections answered at once; one more is closed at once, so that held connections can
# never pile up threads in the process that records the run.
MAX_CONNECTIONS = 8


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


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each read waiting no longer than what is left of the deadline."""

    def __init__(self, sock: socket.socket, deadline: float, timeout_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline
        self._timeout_s = timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long")
        self._sock.settimeout(min(left, self._timeout_s))
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._timeout_s)


class _Handler(WSGIRequestHandler):
    """One request per connection, read within REQUEST_TIMEOUT_S; logs nothing, and says a
    failure of the exposition once instead of a traceback at each scrape."""

    timeout = REQUEST_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        raw = _DeadlineReader(self.connection, deadline, REQUEST_TIMEOUT_S)
        self.rfile = io.BufferedReader(raw)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    def get_stderr(self) -> io.StringIO:
        return _FailureNote()


class _FailureNote(io.StringIO):
    """Where wsgiref writes the traceback of a failed answer: one line, once per process."""

    said = False

    def flush(self) -> None:
        text = self.getvalue().strip()
        if text and not _FailureNote.said:
            _FailureNote.said = True
            last = text.splitlines()[-1]
            print(
                printable(f"memdoc: warning: a metrics scrape failed ({last})"),
                file=sys.stderr,
                flush=True,
            )


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS of them."""

    daemon_threads = True
    block_on_close = False

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # busy: this one is closed unanswered
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away: its connection is closed, nothing said."""


def serve(collector: Collector, port: int, address: str = DEFAULT_ADDRESS) -> MetricsServer:
    """Expose one collector, and nothing else, on `address:port` (port 0: any free port).

    The registry is memdoc's own: no process or platform metrics of memdoc itself, which
    would be mistaken for the program's. prometheus-client's application answers GET (any
    path: the exposition), OPTIONS, and 405 to every other method; it writes nothing.

    Raises:
        MemdocError: the port is out of range or taken, or the address is not this machine's
            or not an address at all.
    """
    if not 0 <= port <= MAX_PORT:
        raise MemdocError(f"metrics port {port} is not a port (0 to {MAX_PORT})")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server = _bind(address, port, registry)
    thread = threading.Thread(target=server.serve_forever, name="memdoc-metrics", daemon=True)
    thread.start()
    return MetricsServer(address, int(server.server_port), server, thread)


def _bind(address: str, port: int, registry: CollectorRegistry) -> _BoundedServer:
    shown = ascii(address)[1:-1][:80]  # as escapes where it is not plain ASCII
    try:
        family, host = _family(address, port)

        class Server(_BoundedServer):
            address_family = family

        return make_server(host, port, make_wsgi_app(registry), Server, _Handler)
    except OSError as exc:
        raise MemdocError(
            f"cannot serve metrics on {shown}:{port} ({exc.strerror or exc})",
            hint="choose another port (0 takes any free one), or an address this machine has",
        ) from None
    except (UnicodeError, ValueError):
        raise MemdocError(
            f"cannot serve metrics on {shown}:{port} (not a host name or an IP address)",
            hint="give an IP address (127.0.0.1, 0.0.0.0, ::1) or a host name of this machine",
        ) from None


def _family(address: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and host to bind for `address` (IPv6 where it is one)."""
    found = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = found[0]
    return family, str(sockaddr[0])
