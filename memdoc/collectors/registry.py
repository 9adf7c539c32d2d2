"""Which collectors run where: in the program's process, or in `memdoc run`'s parent."""

from __future__ import annotations

import os
from pathlib import Path

from memdoc.collectors.base import Collector


def in_process_collectors(
    *,
    host_tree: bool = True,
    nvml: bool = True,
    trace_dir: Path | None = None,
    loops: bool = True,
) -> list[Collector]:
    """Collectors for `memdoc.watch`: host memory of this process (and its children),
    NVML, every framework the program imports, and (unless `loops` is False) the steps and
    phases of the frameworks' own loops. Files saved at an OOM go to `trace_dir`."""
    from memdoc.collectors.frameworks import framework_collectors
    from memdoc.collectors.host import HostCollector
    from memdoc.collectors.loops import LoopCollector
    from memdoc.collectors.nvml import NvmlCollector

    collectors: list[Collector] = [HostCollector(os.getpid(), include_children=host_tree)]
    if nvml:
        collectors.append(NvmlCollector(root_pid=os.getpid()))
    collectors.extend(framework_collectors(trace_dir=trace_dir))
    if loops:
        collectors.append(LoopCollector())
    return collectors


def agent_collectors() -> list[Collector]:
    """Collectors for the agent inside each process of `memdoc run`: frameworks and their
    loops only (the parent samples host memory and NVML for the whole tree)."""
    from memdoc.collectors.frameworks import SNAPSHOT_DIR_ENV, framework_collectors
    from memdoc.collectors.loops import LoopCollector

    configured = os.environ.get(SNAPSHOT_DIR_ENV)
    return [
        *framework_collectors(trace_dir=Path(configured) if configured else None),
        LoopCollector(),
    ]


def parent_collectors(root_pid: int, *, nvml: bool = True) -> list[Collector]:
    """Collectors for `memdoc run`'s parent: the child's process tree and NVML."""
    from memdoc.collectors.host import HostCollector
    from memdoc.collectors.nvml import NvmlCollector

    collectors: list[Collector] = [HostCollector(root_pid, include_children=True)]
    if nvml:
        collectors.append(NvmlCollector(root_pid=root_pid))
    return collectors
