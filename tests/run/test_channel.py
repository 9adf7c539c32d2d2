"""The channel from an agent to the parent, over a real local socket: the agent never waits,
and comes back when the parent does."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from memdoc.run.channel import MAX_QUEUED, AgentChannel, AgentServer
from memdoc.trace import load_trace
from memdoc.trace.model import SCHEMA_VERSION, Event, EventKind, Header
from memdoc.trace.writer import TraceWriter


def _step(number: int) -> Event:
    return Event(t=time.time(), kind=EventKind.STEP, pid=os.getpid(), data={"step": number})


def _wait_for(condition: object, timeout_s: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _pumped(channel: AgentChannel) -> bool:
    channel.pump()
    return True


def test_an_agent_reconnects_to_a_parent_that_comes_back_and_says_what_was_lost(
    tmp_path: Path,
) -> None:
    socket_path = str(tmp_path / "agent.sock")
    writer = TraceWriter(
        tmp_path / "t.memdoc",
        Header(version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="t"),
    )
    first = AgentServer(socket_path, writer).start()
    channel = AgentChannel(socket_path)
    channel.event(_step(1))
    channel.pump()
    _wait_for(lambda: first.messages >= 1)

    # WHEN the parent's end goes away while the program goes on, longer than the queue
    # holds, then a parent listens again
    first.stop(drain_s=0)
    sent = list(range(2, MAX_QUEUED + 100))
    for number in sent:
        channel.event(_step(number))
    second = AgentServer(socket_path, writer).start()
    # The sampler's next rounds, or the program's next steps: the agent tries again at most
    # once a RECONNECT_S, so one pump right after the parent came back may come too soon.
    _wait_for(lambda: _pumped(channel) and second.messages >= 1)
    channel.close()
    second.stop()
    writer.close()

    # THEN the agent reconnected, and the trace says what it lost in between, from whom
    trace = load_trace(tmp_path / "t.memdoc")
    numbers = [e.data["step"] for e in trace.events(EventKind.STEP)]
    assert numbers == list(range(1, len(numbers) + 1))  # what arrived, in order
    assert len(numbers) >= MAX_QUEUED  # the whole queue's worth came after the gap
    (loss,) = trace.losses()
    assert loss.pid == os.getpid()
    assert loss.events == 1 + len(sent) - len(numbers)  # every step not in the trace counted
    assert loss.samples == 0
    assert loss.start_s <= loss.end_s


def test_an_agent_whose_parent_never_reads_keeps_queueing_nothing_beyond_its_bound(
    tmp_path: Path,
) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "agent.sock"))
    listener.listen(1)  # a parent that never reads: stopped, or swapped out
    channel = AgentChannel(str(tmp_path / "agent.sock"))

    started = time.perf_counter()
    for number in range(5 * MAX_QUEUED):
        channel.event(_step(number))
    took_s = time.perf_counter() - started

    assert len(channel._queue) <= MAX_QUEUED  # memory stays bounded
    assert took_s < 5.0  # and the program never waited (about 10 µs a step)
    started = time.perf_counter()
    channel.close(timeout_s=2.0)
    assert time.perf_counter() - started < 1.0  # nor does its exit wait for the parent
    listener.close()


def test_an_agent_starting_while_the_parent_cannot_accept_does_not_wait_and_connects_later(
    tmp_path: Path,
) -> None:
    socket_path = str(tmp_path / "agent.sock")
    writer = TraceWriter(
        tmp_path / "t.memdoc",
        Header(version=SCHEMA_VERSION, created_unix=time.time(), memdoc_version="t"),
    )
    # GIVEN a parent whose backlog of connections is full (stopped while processes start)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(0)
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiting.connect(socket_path)

    # WHEN an agent starts
    started = time.perf_counter()
    channel = AgentChannel(socket_path)
    took_s = time.perf_counter() - started
    channel.event(_step(1))

    # THEN it did not wait, and its messages arrive once the parent accepts again
    assert took_s < 0.5
    waiting.close()
    listener.close()
    os.unlink(socket_path)
    server = AgentServer(socket_path, writer).start()
    _wait_for(lambda: _pumped(channel) and server.messages >= 1)  # the sampler's rounds
    channel.close()
    server.stop()
    writer.close()
    assert [e.data["step"] for e in load_trace(tmp_path / "t.memdoc").steps()] == [1]


def test_an_agent_with_no_parent_at_all_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        AgentChannel(str(tmp_path / "nobody.sock"))
