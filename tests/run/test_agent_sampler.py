"""How the agent chooses to sample: on a thread of its own only where a device's counters can
move between the program's steps, never under an address-space cap; a user may choose."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import pytest

from memdoc.run.agent import ENV_SAMPLER, sampler_thread_wanted


@pytest.fixture(autouse=True)
def _no_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SAMPLER, raising=False)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (-1, -1))


def test_a_machine_with_an_accelerator_node_gets_the_thread(tmp_path: Path) -> None:
    node = tmp_path / "nvidiactl"
    node.touch()
    assert sampler_thread_wanted((str(tmp_path / "kfd"), str(node)))


def test_a_machine_without_one_samples_at_steps(tmp_path: Path) -> None:
    assert not sampler_thread_wanted((str(tmp_path / "nvidiactl"),))


def test_an_address_space_cap_rules_the_thread_out_even_with_an_accelerator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (8 << 30, 8 << 30))
    assert not sampler_thread_wanted((str(node),))


@pytest.mark.parametrize(("chosen", "wanted"), [("thread", True), (" Steps ", False)])
def test_the_user_chooses_over_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chosen: str, wanted: bool
) -> None:
    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setenv(ENV_SAMPLER, chosen)
    assert sampler_thread_wanted(()) is wanted
    assert sampler_thread_wanted((str(node),)) is wanted


class _Sink:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.sampled: list[dict[Any, Any]] = []

    def event(self, event: Any) -> None:
        self.events.append(event)

    def samples(self, t: float, values: Any) -> None:
        self.sampled.append(dict(values))

    def process(self, process: Any) -> None:
        pass

    def device(self, device: Any) -> None:
        pass

    def collector(self, status: Any) -> None:
        pass


class _LateRuntime:
    """A framework whose runtime starts after the session did: a collector learns of it only
    when it samples (as the JAX and TensorFlow collectors do), and knows the live arrays at
    an error only once it has."""

    name = "late-runtime"

    def __init__(self) -> None:
        self.up = False
        self.known = False

    def probe(self) -> Any:
        from memdoc.trace.model import CollectorStatus

        return CollectorStatus(self.name, True)

    def start(self, session: Any) -> None:
        pass

    def sample(self, unix_t: float) -> dict[Any, Any]:
        from memdoc.trace.model import SeriesKey

        self.known = self.known or self.up
        return {SeriesKey("jax.allocated", -1, 1): 64 << 20} if self.known else {}

    def close(self) -> None:
        pass

    def oom_context(self, exc: BaseException) -> dict[str, Any] | None:
        return {"live_array_bytes": 64 << 20} if self.known else None


def test_without_its_thread_the_session_samples_at_a_memory_error() -> None:
    # No step came between the runtime's start and the error: without a sample at the error
    # the collector would not know its runtime, and the error would go without its arrays.
    from memdoc.session import Session

    sink, runtime = _Sink(), _LateRuntime()
    session = Session(sink, [runtime], interval_s=60.0).start(thread=False)
    runtime.up = True
    try:
        raise MemoryError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 922 MiB")
    except MemoryError as exc:
        session.record_exception(exc, exc.__traceback__, where="uncaught")
    session.stop()

    ooms = [e for e in sink.events if e.kind == "oom"]
    assert ooms and ooms[0].data.get("live_array_bytes") == 64 << 20
    assert any(values for values in sink.sampled)  # the memory at the error is in the trace
