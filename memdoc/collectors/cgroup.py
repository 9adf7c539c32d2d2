"""A process's memory cgroup (v1 or v2): usage, the tightest limit above it, OOM kills, members."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from memdoc.collectors.base import Values
from memdoc.trace.model import Metric, SeriesKey

CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNLIMITED = 1 << 60  # cgroup v1 writes a huge number for "no limit"
_MAX_MEMBER_DIRS = 256  # a cgroup with more sub-cgroups than this is not a job's own
_FILES = {
    # version: (usage, limit, events)
    1: ("memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control"),
    2: ("memory.current", "memory.max", "memory.events"),
}


@dataclass(frozen=True)
class CgroupLimit:
    """The tightest memory limit on a cgroup: its bytes, and the cgroup that sets it."""

    limit_bytes: int
    path: str  # as /proc/PID/cgroup writes it, e.g. "/job.slice/step_0"
    file: str  # "memory.max" (v2) or "memory.limit_in_bytes" (v1)


@dataclass(frozen=True)
class CgroupFiles:
    """One memory cgroup, `directory`, inside the hierarchy mounted at `top`."""

    version: int
    directory: Path
    top: Path

    @property
    def path(self) -> str:
        """The cgroup's own name, "/" for the top of the hierarchy."""
        rel = self.directory.relative_to(self.top).as_posix()
        return "/" if rel == "." else "/" + rel

    def read(self) -> Values:
        """Usage, the tightest limit (this cgroup or one above it) and OOM kills."""
        usage_name, _, events_name = _FILES[self.version]
        values: Values = {}
        usage = _read_int(self.directory / usage_name)
        if usage is not None:
            values[SeriesKey(Metric.CGROUP_USAGE)] = usage
        limit = self.tightest_limit()
        if limit is not None:
            values[SeriesKey(Metric.CGROUP_LIMIT)] = limit.limit_bytes
        kills = _oom_kills(self.directory / events_name)
        if kills is not None:
            values[SeriesKey(Metric.CGROUP_OOM_KILLS)] = kills
        return values

    def tightest_limit(self) -> CgroupLimit | None:
        """The lowest limit of this cgroup and every readable one above it: a limit set on
        a parent (a job's slice, a container) bounds all the cgroups below it."""
        limit_name = _FILES[self.version][1]
        best: CgroupLimit | None = None
        directory = self.directory
        while True:
            value = _read_int(directory / limit_name)
            tighter = best is None or (value is not None and value < best.limit_bytes)
            if value is not None and value < _UNLIMITED and tighter:
                here = CgroupFiles(self.version, directory, self.top)
                best = CgroupLimit(value, here.path, limit_name)
            if directory == self.top or self.top not in directory.parents:
                return best
            directory = directory.parent

    def member_pids(self) -> set[int] | None:
        """Every process in this cgroup and the cgroups below it; None when unreadable."""
        pids: set[int] = set()
        for count, (folder, _, _) in enumerate(os.walk(self.directory)):
            if count >= _MAX_MEMBER_DIRS:
                return None
            try:
                text = (Path(folder) / "cgroup.procs").read_text()
            except OSError:
                if count == 0:
                    return None
                continue
            pids.update(int(line) for line in text.split() if line.isdigit())
        return pids


def find_cgroup(pid: int, root: Path = CGROUP_ROOT) -> CgroupFiles | None:
    """The memory cgroup of `pid` (v2 unified or v1 memory controller), if readable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    return cgroup_from_lines(lines, root)


def cgroup_from_lines(lines: list[str], root: Path) -> CgroupFiles | None:
    """Parse /proc/PID/cgroup lines ("0::/path" for v2, "N:memory:/path" for v1)."""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":
            found = _first_with(2, root, root / rel, root)
        elif "memory" in controllers.split(","):
            top = root / "memory"
            found = _first_with(1, top, top / rel, top)
        else:
            continue
        if found is not None:
            return found
    return None


def _first_with(version: int, top: Path, *candidates: Path) -> CgroupFiles | None:
    """The first candidate that has the version's usage file. Inside a container the path
    /proc names is the host's, and the container's own cgroup is mounted at the top."""
    usage_name = _FILES[version][0]
    for directory in candidates:
        if (directory / usage_name).exists():
            return CgroupFiles(version, directory, top)
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _oom_kills(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None
