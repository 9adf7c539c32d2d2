"""Real memory cgroups for tests: made below this process's own cgroup, removed after."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from memdoc.collectors.cgroup import find_cgroup

_names = itertools.count()


@dataclass(frozen=True)
class RealCgroup:
    """A memory cgroup that exists on this machine; `path` as /proc/PID/cgroup names it."""

    directory: Path
    version: int
    path: str

    def add(self, pid: int) -> None:
        (self.directory / "cgroup.procs").write_text(f"{pid}\n")

    def child(self, name: str) -> RealCgroup:
        directory = self.directory / name
        directory.mkdir()
        return RealCgroup(directory, self.version, f"{self.path}/{name}")

    def limit(self, limit_bytes: int) -> None:
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        (self.directory / name).write_text(f"{limit_bytes}\n")


@contextlib.contextmanager
def real_memory_cgroup() -> Iterator[RealCgroup]:
    """A fresh memory cgroup below this process's own one (cgroup v1 here; v2 where the
    parent lets a child take the memory controller). Skips the test where it cannot."""
    own = find_cgroup(os.getpid())
    if own is None:
        pytest.skip("no readable memory cgroup on this machine")
    name = f"memdoc-test-{os.getpid()}-{next(_names)}"
    directory = own.directory / name
    try:
        directory.mkdir()
        if own.version == 2 and not (directory / "memory.max").exists():
            raise PermissionError("memory controller not delegated")
    except OSError as exc:
        with contextlib.suppress(OSError):
            directory.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    made = RealCgroup(directory, own.version, f"{own.path.rstrip('/')}/{name}")
    try:
        yield made
    finally:
        _remove(directory)


def _remove(directory: Path) -> None:
    """Remove a test cgroup and those below it, deepest first, once their processes ended."""
    folders = sorted((Path(f) for f, _, _ in os.walk(directory)), key=lambda p: -len(p.parts))
    for folder in folders:
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)
