"""The local channel from agents in the program's processes to the parent that writes the trace."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
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
MAX_QUEUED = 10_000  # messages an agent keeps when the parent is slow; newer ones are dropped
SEND_INTERVAL_S = 0.2
RECONNECT_S = 1.0
_NO_SIGPIPE = getattr(socket, "MSG_NOSIGNAL", 0)
SAMPLES = "samples"
EVENTS = "events"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


_URGENT = frozenset({EventKind.OOM, EventKind.EXCEPTION, EventKind.PROCESS_EXIT})


def _dumps(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


class AgentChannel:
    """The agent's end: a Sink that queues messages and sends, from whichever thread calls
    it, what the socket takes at once, so the program never waits on memdoc.

    It has no thread of its own: in glibc every thread a process starts reserves its stack
    and, usually, a malloc arena of 64 MiB of address space, which a program under an
    address-space cap would lose. Ordinary messages go out with the first message queued
    `SEND_INTERVAL_S` after the last send, or at the next `pump()` (the agent's sampler, or
    the program's next step); the ones that may come right before a death go at once.

    When the parent cannot keep up (stopped, swapped out, gone), the queue fills and further
    messages are dropped and counted, never waited for; once the parent reads again the
    backlog goes out, then one loss message with the counts and the time range. A lost
    connection is retried at most every `RECONNECT_S`.
    """

    def __init__(self, socket_path: str) -> None:
        self._path = socket_path
        self._pid = os.getpid()
        self._sock: socket.socket | None = connect_now(socket_path)
        self._queue: collections.deque[tuple[str, bytes]] = collections.deque()
        self._pending = b""  # the part of a chunk the socket has not taken yet
        self._pending_kinds: list[str] = []
        self._losses = _Losses()
        self._sending = threading.Lock()
        self._last_send_mono = time.monotonic()
        self._next_connect_mono = 0.0
        self._closed = False

    # -- Sink -----------------------------------------------------------------------------

    def samples(self, unix_t: float, values: Mapping[SeriesKey, int | float]) -> None:
        rows = [[k.metric, k.device, k.pid, v] for k, v in values.items() if v is not None]
        if rows:
            self._put(SAMPLES, {"k": "s", "t": unix_t, "v": rows})

    def event(self, event: Event) -> None:
        # Sending on every event (a step every few milliseconds) would make each step pay
        # for a system call; ordinary events go with the next periodic send.
        self._put(
            EVENTS,
            {
                "k": "e",
                "t": event.t,
                "kind": event.kind,
                "pid": event.pid,
                "data": dict(event.data),
            },
            urgent=event.kind in _URGENT,
        )

    def device(self, device: DeviceInfo) -> None:
        self._put(EVENTS, {"k": "d", **asdict(device)}, urgent=True)

    def process(self, process: ProcessInfo) -> None:
        self._put(EVENTS, {"k": "p", **asdict(process)}, urgent=True)

    def collector(self, status: CollectorStatus) -> None:
        self._put(EVENTS, {"k": "c", **asdict(status)}, urgent=True)

    # -- queueing -------------------------------------------------------------------------

    def _put(self, kind: str, message: Mapping[str, Any], *, urgent: bool = False) -> None:
        if self._closed:
            return
        # Rare records (devices, processes, OOMs) are kept even over the bound.
        if len(self._queue) >= MAX_QUEUED and not urgent:
            self._losses.add(kind, time.time())
            return
        try:
            self._queue.append((kind, _dumps(message)))
        except (TypeError, ValueError):
            return
        if urgent or time.monotonic() - self._last_send_mono >= SEND_INTERVAL_S:
            self.pump()

    # -- sending --------------------------------------------------------------------------

    def pump(self) -> None:
        """Send what the socket takes now, connecting again if the parent went away; never
        waits, never raises. A thread that finds another one sending leaves it to it."""
        if not self._sending.acquire(blocking=False):
            return
        try:
            self._last_send_mono = time.monotonic()
            self._send(deadline_mono=None)
        except Exception:
            pass  # nothing may reach the program from here
        finally:
            self._sending.release()

    def _send(self, deadline_mono: float | None) -> None:
        if self._sock is not None and self._queue and not self._pending and _peer_gone(self._sock):
            self._disconnect()
        if self._sock is None:
            self._reconnect()
        if self._sock is not None:
            self._drain(deadline_mono)

    def _reconnect(self) -> None:
        now = time.monotonic()
        if now < self._next_connect_mono:
            return
        self._next_connect_mono = now + RECONNECT_S
        with contextlib.suppress(OSError):
            self._sock = connect_now(self._path)

    def _drain(self, deadline_mono: float | None) -> None:
        """Send until the queue is empty or the socket is full; with a deadline (at exit),
        wait for the socket while it keeps taking data, until then."""
        while self._sock is not None:
            if not self._pending and not self._next_chunk():
                return
            try:
                # Without MSG_NOSIGNAL a dead parent would kill a program that restored
                # SIGPIPE's default action, as command-line tools often do.
                sent = self._sock.send(self._pending, _NO_SIGPIPE)
            except BlockingIOError:
                if not _wait_writable(self._sock, deadline_mono):
                    return
                continue
            except InterruptedError:
                continue
            except OSError:
                self._disconnect()
                return
            self._pending = self._pending[sent:]
            if not self._pending:
                self._pending_kinds = []  # all taken: nothing of it can be lost any more

    def _next_chunk(self) -> bool:
        """Take the next messages to send into the pending chunk; False when none are left."""
        # Once the queue has room again the drops have stopped: say what was lost, after
        # the backlog, even if the parent stays a little behind.
        if len(self._queue) <= MAX_QUEUED // 2:
            loss = self._losses.take(self._pid)
            if loss is not None:
                self._queue.append((EVENTS, _dumps(loss)))
        if not self._queue:
            return False
        batch = [self._queue.popleft() for _ in range(min(len(self._queue), 256))]
        self._pending = b"".join(data for _, data in batch)
        self._pending_kinds = [kind for kind, _ in batch]
        return True

    def _disconnect(self) -> None:
        """The parent went away: what was being sent is lost (counted); reconnect later."""
        now = time.time()
        for kind in self._pending_kinds:
            self._losses.add(kind, now)
        self._pending, self._pending_kinds = b"", []
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._next_connect_mono = 0.0  # a parent that is back again takes us at once

    def close(self, timeout_s: float = 1.0) -> None:
        """Send what is queued (at most `timeout_s`, and no longer than `SEND_INTERVAL_S`
        once the parent stops reading), then close."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        if not self._sending.acquire(timeout=timeout_s):
            return
        try:
            with contextlib.suppress(Exception):
                self._send(deadline_mono=deadline)
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()
                self._sock = None
        finally:
            self._sending.release()


def _peer_gone(sock: socket.socket) -> bool:
    """True when the parent closed its end: it never writes to an agent, so a readable
    socket means an end of file or an error."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _wait_writable(sock: socket.socket, deadline_mono: float | None) -> bool:
    """Wait for room in the socket until the deadline, at most `SEND_INTERVAL_S` (a parent
    that does not read for that long is not reading); False at once without a deadline."""
    if deadline_mono is None:
        return False
    left = min(SEND_INTERVAL_S, deadline_mono - time.monotonic())
    if left <= 0:
        return False
    _, writable, _ = select.select([], [sock], [], left)
    return bool(writable)


def connect_now(path: str) -> socket.socket | None:
    """Connect without waiting. None when the parent is too busy to take the connection now
    (the sender thread connects later).

    Raises:
        OSError: no parent listens at `path` (a stale environment): no agent then.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect(path)
    except BlockingIOError:  # the parent's backlog is full: stopped, or swamped
        sock.close()
        return None
    except OSError:
        sock.close()
        raise
    return sock


class _Losses:
    """Counts of messages dropped since the last loss message, and when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._first_t: float | None = None
        self._last_t = 0.0

    def add(self, kind: str, unix_t: float) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            if self._first_t is None:
                self._first_t = unix_t
            self._last_t = unix_t

    def take(self, pid: int) -> dict[str, Any] | None:
        """The loss message for what was dropped so far, and start counting afresh."""
        with self._lock:
            if self._first_t is None:
                return None
            message = {
                "k": "l",
                "pid": pid,
                "t": self._last_t,
                "first_t": self._first_t,
                SAMPLES: self._counts.get(SAMPLES, 0),
                EVENTS: self._counts.get(EVENTS, 0),
            }
            self._counts, self._first_t = {}, None
            return message


_WAKE = object()  # the selector key of the wake-up socket


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
        # stop() writes to this pair so that the loop ends now, not at its next timeout.
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, _WAKE)
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
            time.sleep(0.01)
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")
        if self._thread.is_alive():
            self._thread.join(2.0)
        for conn in list(self._buffers):
            self._close(conn)
        self._listener.close()
        self._wake_read.close()
        self._wake_write.close()
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                if key.data is _WAKE:
                    continue  # stop() was called: the loop's condition ends it
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
            elif kind == "l":
                self.writer.event(_loss_event(msg))
            self.messages += 1
        except (ValueError, TypeError, KeyError):
            return  # one bad message from an agent never stops the run


def _loss_event(msg: Mapping[str, Any]) -> Event:
    last_t, first_t = float(msg["t"]), float(msg["first_t"])
    return Event(
        t=last_t,
        kind=EventKind.LOSS,
        pid=int(msg["pid"]),
        data={
            "samples": int(msg[SAMPLES]),
            "events": int(msg[EVENTS]),
            "duration_s": round(max(0.0, last_t - first_t), 3),
        },
    )
