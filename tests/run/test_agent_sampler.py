"""How the agent chooses to sample: on a thread of its own only where a device's counters can
move between the program's steps, never under an address-space cap; a user may choose."""

from __future__ import annotations

import resource
from pathlib import Path

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
