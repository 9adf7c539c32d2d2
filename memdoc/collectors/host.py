"""Host memory: RSS of a process tree, system memory, and the cgroup's limit and OOM kills."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from memdoc.collectors.base import SessionHandle, Values
from memdoc.trace.model import CollectorStatus, Event, EventKind, Metric, ProcessInfo, SeriesKey

TREE_REFRESH_S = 1.0
SYSTEM_REFRESH_S = 0.5
_UNLIMITED = 1 << 60  # cgroup v1 writes a huge number for "no limit"


@dataclass(frozen=True)
class CgroupFiles:
    """Where one cgroup's memory files are, for v2 or v1."""

    version: int
    usage: Path
    limit: Path | None
    events: Path | None  # v2 memory.events, or v1 memory.oom_control

    def read(self) -> Values:
        values: Values = {}
        usage = _read_int(self.usage)
        if usage is not None:
            values[SeriesKey(Metric.CGROUP_USAGE)] = usage
        if self.limit is not None:
            limit = _read_int(self.limit)
            if limit is not None and limit < _UNLIMITED:
                values[SeriesKey(Metric.CGROUP_LIMIT)] = limit
        if self.events is not None:
            kills = _oom_kills(self.events)
            if kills is not None:
                values[SeriesKey(Metric.CGROUP_OOM_KILLS)] = kills
        return values


def find_cgroup(pid: int, root: Path = Path("/sys/fs/cgroup")) -> CgroupFiles | None:
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
            base = root / rel
            if (base / "memory.current").exists():
                return CgroupFiles(
                    2, base / "memory.current", base / "memory.max", base / "memory.events"
                )
            if (root / "memory.current").exists():  # inside a container: its root is its cgroup
                return CgroupFiles(
                    2, root / "memory.current", root / "memory.max", root / "memory.events"
                )
        elif "memory" in controllers.split(","):
            for base in (root / "memory" / rel, root / "memory"):
                if (base / "memory.usage_in_bytes").exists():
                    return CgroupFiles(
                        1,
                        base / "memory.usage_in_bytes",
                        base / "memory.limit_in_bytes",
                        base / "memory.oom_control",
                    )
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


def address_space_limit(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """A process's RLIMIT_AS soft limit in bytes (as `ulimit -v` or `resource.setrlimit`
    set it), None when unlimited or unreadable. Such a cap, not the machine, is then where
    the program's memory ends."""
    try:
        text = (proc_root / str(pid) / "limits").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Max address space"):
            soft = line[len("Max address space") :].split()[0]
            return int(soft) if soft.isdigit() else None
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


class HostCollector:
    """RSS of every process in a tree (Process objects kept, children refreshed each second),
    system available memory and swap, and the cgroup of the root process."""

    name = "host"

    def __init__(self, root_pid: int, *, include_children: bool = True) -> None:
        self.root_pid = root_pid
        self.include_children = include_children
        self._procs: dict[int, psutil.Process] = {}
        self._session: SessionHandle | None = None
        self._last_tree = 0.0
        self._last_system = 0.0
        self._system: Values = {}
        self._cgroup: CgroupFiles | None = None

    def probe(self) -> CollectorStatus:
        try:
            psutil.Process(self.root_pid).memory_info()
        except psutil.Error as exc:
            return CollectorStatus(
                self.name, False, reason=f"cannot read process {self.root_pid}: {exc}"
            )
        return CollectorStatus(self.name, True, version=f"psutil {psutil.__version__}")

    def start(self, session: SessionHandle) -> None:
        self._session = session
        self._procs[self.root_pid] = psutil.Process(self.root_pid)
        self._cgroup = find_cgroup(self.root_pid)
        self._system[SeriesKey(Metric.HOST_TOTAL)] = psutil.virtual_memory().total

    def sample(self, unix_t: float) -> Values:
        if self.include_children and unix_t - self._last_tree >= TREE_REFRESH_S:
            self._last_tree = unix_t
            self._refresh_tree(unix_t)
        values: Values = {}
        total = 0
        for pid, proc in list(self._procs.items()):
            try:
                info = proc.memory_info()
            except psutil.Error:
                self._gone(pid, unix_t)
                continue
            rss = info.rss
            values[SeriesKey(Metric.HOST_RSS, pid=pid)] = rss
            if SeriesKey(Metric.HOST_RLIMIT_AS, pid=pid) in self._system:
                # Only where a cap applies: then the room left is the cap minus this.
                values[SeriesKey(Metric.HOST_VMS, pid=pid)] = info.vms
            total += rss
        if self._procs:
            values[SeriesKey(Metric.HOST_RSS)] = total
        if unix_t - self._last_system >= SYSTEM_REFRESH_S:
            self._last_system = unix_t
            self._read_system()
        values.update(self._system)
        return values

    def close(self) -> None:
        self._procs.clear()

    def _read_system(self) -> None:
        vm = psutil.virtual_memory()
        self._system[SeriesKey(Metric.HOST_AVAILABLE)] = vm.available
        with contextlib.suppress(psutil.Error, OSError, RuntimeError):
            self._system[SeriesKey(Metric.HOST_SWAP_USED)] = psutil.swap_memory().used
        if self._cgroup is not None:
            self._system.update(self._cgroup.read())
        for pid in list(self._procs):
            limit = address_space_limit(pid)
            key = SeriesKey(Metric.HOST_RLIMIT_AS, pid=pid)
            if limit is not None:
                self._system[key] = limit
            else:
                self._system.pop(key, None)

    def _refresh_tree(self, unix_t: float) -> None:
        root = self._procs.get(self.root_pid)
        if root is None:
            return
        # A program may move itself into a cgroup of its own (a job step, a test harness):
        # follow it, so its limit and OOM kills are the ones recorded.
        moved = find_cgroup(self.root_pid)
        if moved is not None and moved != self._cgroup:
            self._cgroup = moved
        try:
            children = root.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            if child.pid in self._procs:
                continue
            self._procs[child.pid] = child
            self._announce(child, unix_t)

    def _announce(self, proc: psutil.Process, unix_t: float) -> None:
        if self._session is None:
            return
        try:
            command = tuple(proc.cmdline())[:64]
            ppid = proc.ppid()
        except psutil.Error:
            command, ppid = (), None
        self._session.process(ProcessInfo(pid=proc.pid, t=unix_t, ppid=ppid, command=command))
        self._session.event(
            Event(
                t=unix_t,
                kind=EventKind.PROCESS_START,
                pid=proc.pid,
                data={"command": list(command[:8])},
            )
        )

    def _gone(self, pid: int, unix_t: float) -> None:
        self._procs.pop(pid, None)
        if self._session is not None and pid != self.root_pid:
            self._session.event(
                Event(t=unix_t or time.time(), kind=EventKind.PROCESS_EXIT, pid=pid)
            )
