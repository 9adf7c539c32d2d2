"""Host memory: RSS of a process tree, system memory, and the cgroup's limit and OOM kills."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

from memdoc.collectors.base import SessionHandle, Values
from memdoc.collectors.cgroup import CgroupFiles, cgroup_from_lines, find_cgroup
from memdoc.trace.model import CollectorStatus, Event, EventKind, Metric, ProcessInfo, SeriesKey

TREE_REFRESH_S = 1.0
SYSTEM_REFRESH_S = 0.5

__all__ = [
    "CgroupFiles",
    "HostCollector",
    "address_space_limit",
    "cgroup_from_lines",
    "find_cgroup",
]


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
        self._cgroup_said: dict[str, object] | None = None

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
        anon: int | None = None  # None where the platform does not tell file pages apart
        for pid, proc in list(self._procs.items()):
            try:
                info = proc.memory_info()
            except psutil.Error:
                self._gone(pid, unix_t)
                continue
            rss = info.rss
            values[SeriesKey(Metric.HOST_RSS, pid=pid)] = rss
            shared = getattr(info, "shared", None)  # file and shared pages (Linux)
            if shared is not None:
                own = max(rss - shared, 0)
                values[SeriesKey(Metric.HOST_ANON, pid=pid)] = own
                anon = own + (anon or 0)
            if SeriesKey(Metric.HOST_RLIMIT_AS, pid=pid) in self._system:
                # Only where a cap applies: then the room left is the cap minus this.
                values[SeriesKey(Metric.HOST_VMS, pid=pid)] = info.vms
            total += rss
        if self._procs:
            values[SeriesKey(Metric.HOST_RSS)] = total
            if anon is not None:
                values[SeriesKey(Metric.HOST_ANON)] = anon
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
        for metric in (Metric.CGROUP_USAGE, Metric.CGROUP_LIMIT, Metric.CGROUP_OOM_KILLS):
            self._system.pop(SeriesKey(metric), None)  # a cgroup moved to may lack one
        if self._cgroup is not None:
            self._system.update(self._cgroup.read())
            self._say_cgroup(self._cgroup)
        self._count_others(set(self._procs))
        for pid in list(self._procs):
            limit = address_space_limit(pid)
            key = SeriesKey(Metric.HOST_RLIMIT_AS, pid=pid)
            if limit is not None:
                self._system[key] = limit
            else:
                self._system.pop(key, None)

    def _refresh_tree(self, unix_t: float) -> None:
        root = self._procs.get(self.root_pid)
        if root is None or not _alive(root):
            # Its children, if any are left, are no longer its: the ones seen are kept.
            # (Finding a process's children reads every process of the machine.)
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

    def _count_others(self, tree: set[int]) -> None:
        """How many processes share the job's cgroup without being the job's: its usage is
        the job's own only when none do (memdoc itself, sampling, does not count)."""
        members = self._cgroup.member_pids() if self._cgroup is not None else None
        key = SeriesKey(Metric.CGROUP_OTHER_PROCESSES)
        if members is None:
            self._system.pop(key, None)
            return
        self._system[key] = len(members - tree - {os.getpid()})

    def _say_cgroup(self, cgroup: CgroupFiles) -> None:
        """Record the job's cgroup and the one whose limit binds, once and on each change."""
        limit = cgroup.tightest_limit()
        data: dict[str, object] = {"path": cgroup.path, "version": cgroup.version}
        if limit is not None:
            data.update(
                limit_bytes=limit.limit_bytes, limit_cgroup=limit.path, limit_file=limit.file
            )
        if data == self._cgroup_said or self._session is None:
            return
        self._cgroup_said = data
        self._session.event(Event(t=time.time(), kind=EventKind.CGROUP, data=data))

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


def _alive(proc: psutil.Process) -> bool:
    """The process runs (a zombie, exited but not yet waited for, does not)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
