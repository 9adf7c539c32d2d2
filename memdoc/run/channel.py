"""The local channel from agents in the program's processes to the parent that writes the trace."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from memdoc.collectors.base import Sink
from memdoc.trace.model import (
    CollectorStatus,
    DeviceInfo,
    Event,
    EventKind,
    ProcessInfo,
    SeriesKey,
)

ENV_SOCKET = "MEMDOC_AGENT"
ENV_INTERVAL = "MEMDOC_INTERVAL"
MAX_QUEUED = 10_000  # messages an agent keeps when the parent is slow; older ones are dropped
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


_URGENT = frozenset({EventKind.OOM, EventKind.EXCEPTION, EventKind.PROCESS_EXIT})


def _dumps(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


class AgentChannel:
    """The agent's end: a Sink that queues messages and sends them from a background thread,
    so the program never waits on memdoc. When the parent is gone, messages are dropped."""

    def __init__(self, socket_path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(2.0)
        self._sock.connect(socket_path)
        self._queue: collections.deque[bytes] = collections.deque(maxlen=MAX_QUEUED)
        self._wake = threading.Event()
        self._closed = False
        self._broken = False
        self._thread = threading.Thread(
            target=self._send_loop, name="memdoc-agent-send", daemon=True
        )
        self._thread.start()

    # -- Sink -----------------------------------------------------------------------------

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        rows = [[k.metric, k.device, k.pid, v] for k, v in values.items() if v is not None]
        if rows:
            self._put({"k": "s", "t": unix_t, "v": rows})

    def event(self, event: Event) -> None:
        self._put(
            {"k": "e", "t": event.t, "kind": event.kind, "pid": event.pid, "data": dict(event.data)}
        )
        # Waking the sender thread on every event (a step every few milliseconds) would
        # hand the GIL back and forth with the program; ordinary events go with the next
        # periodic send, the ones that may come right before a death go at once.
        if event.kind in _URGENT:
            self._wake.set()

    def device(self, device: DeviceInfo) -> None:
        self._put({"k": "d", **asdict(device)})

    def process(self, process: ProcessInfo) -> None:
        self._put({"k": "p", **asdict(process)})

    def collector(self, status: CollectorStatus) -> None:
        self._put({"k": "c", **asdict(status)})

    # -- sending --------------------------------------------------------------------------

    def _put(self, message: Mapping[str, Any]) -> None:
        if self._broken or self._closed:
            return
        try:
            self._queue.append(_dumps(message))
        except (TypeError, ValueError):
            return

    def _send_loop(self) -> None:
        while not self._broken:
            self._wake.wait(0.2)
            self._wake.clear()
            self._drain()
            if self._closed:
                return

    def _drain(self) -> None:
        while self._queue and not self._broken:
            chunk = b"".join(self._queue.popleft() for _ in range(min(len(self._queue), 256)))
            try:
                self._sock.sendall(chunk)
            except OSError:
                self._broken = True  # the parent is gone: memdoc degrades, the program goes on

    def close(self, timeout_s: float = 1.0) -> None:
        """Send what is queued (at most `timeout_s`), then close."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        with contextlib.suppress(OSError):
            self._sock.close()


class AgentServer:
    """The parent's end: accepts agents and writes what they send into the trace."""

    def __init__(self, socket_path: str, writer: Sink) -> None:
        self.socket_path = socket_path
        self.writer = writer
        self.agent_pids: set[int] = set()
        self.messages = 0
        self.oom_events = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(socket_path)
        os.chmod(socket_path, 0o600)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._buffers: dict[socket.socket, bytearray] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memdoc-agent-server", daemon=True)

    def start(self) -> AgentServer:
        self._thread.start()
        return self

    def stop(self, drain_s: float = 1.0) -> None:
        """Read what agents still send for up to `drain_s` (they flush at exit), then stop."""
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and self._buffers:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(2.0)
        for conn in list(self._buffers):
            self._close(conn)
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        conn.setblocking(False)
        self._buffers[conn] = bytearray()
        self._selector.register(conn, selectors.EVENT_READ, "agent")

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        buffer = self._buffers[conn]
        buffer.extend(data)
        if len(buffer) > MAX_MESSAGE_BYTES and b"\n" not in buffer:
            self._close(conn)  # a broken agent; never let it grow the parent's memory
            return
        *lines, rest = bytes(buffer).split(b"\n")
        self._buffers[conn] = bytearray(rest)
        for line in lines:
            self._apply(line)

    def _close(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        self._buffers.pop(conn, None)
        conn.close()

    def _apply(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
            kind = msg.pop("k")
            if kind == "s":
                values = {SeriesKey(str(m), d, p): v for m, d, p, v in msg["v"]}
                self.writer.samples(float(msg["t"]), values)
            elif kind == "e":
                if msg.get("pid") is not None:
                    self.agent_pids.add(int(msg["pid"]))
                if msg.get("kind") == EventKind.OOM:
                    self.oom_events += 1
                self.writer.event(
                    Event(
                        t=float(msg["t"]),
                        kind=str(msg["kind"]),
                        pid=msg.get("pid"),
                        data=msg.get("data") or {},
                    )
                )
            elif kind == "d":
                self.writer.device(DeviceInfo(**msg))
            elif kind == "p":
                msg["command"] = tuple(msg.get("command") or ())
                self.agent_pids.add(int(msg["pid"]))
                self.writer.process(ProcessInfo(**msg))
            elif kind == "c":
                self.writer.collector(CollectorStatus(**msg))
            self.messages += 1
        except (ValueError, TypeError, KeyError):
            return  # one bad message from an agent never stops the run
