"""Who holds the memory: live allocations grouped by the program's own line that made them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePath

from memdoc.importers.snapshot_replay import Live
from memdoc.importers.torch_snapshot import Frame, Stack

TOP_N = 10
_LIBRARY_PARTS = frozenset({"site-packages", "dist-packages", "torch"})
_STDLIB_RE = re.compile(r"[/\\]lib[/\\]python\d+(\.\d+)?[/\\]")


@dataclass(frozen=True)
class Holder:
    """Live memory allocated from one place in the program's own code."""

    site: Frame | None  # the first user frame; None when no stack was recorded
    live_bytes: int
    allocations: int
    share: float  # of all live bytes at that moment
    stack: Stack  # the full stack of the largest of these allocations, innermost first

    @property
    def label(self) -> str:
        """'train.py:42 forward', or why there is no site."""
        if self.site is None:
            return "<no stack recorded>"
        return f"{PurePath(self.site.filename).name}:{self.site.line} {self.site.name}"


@dataclass(frozen=True)
class Holders:
    """Who holds the live memory at one moment, largest first."""

    moment: str  # "snapshot" or "peak"
    time_us: int | None
    total_live_bytes: int
    allocations: int
    top: tuple[Holder, ...]
    other_bytes: int  # live bytes of the sites beyond `top`
    sites: int


def is_user_frame(frame: Frame) -> bool:
    """True for the program's own Python code: not torch, installed packages, the standard
    library, frozen modules or C++."""
    filename = frame.filename
    if filename.startswith("<ipython-input"):
        return True
    if not filename.endswith(".py"):
        return False  # C++ frames, <frozen ...>, <string>
    parts = PurePath(filename.replace("\\", "/")).parts
    if _LIBRARY_PARTS.intersection(parts):
        return False
    return _STDLIB_RE.search(filename) is None


def site_of(stack: Stack) -> Frame | None:
    """The innermost user frame; else the innermost Python frame; else the innermost frame."""
    if not stack:
        return None
    for frame in stack:
        if is_user_frame(frame):
            return frame
    for frame in stack:
        if frame.filename.endswith(".py"):
            return frame
    return stack[0]


class _Group:
    __slots__ = ("count", "largest", "live_bytes")

    def __init__(self, first: Live) -> None:
        self.live_bytes = 0
        self.count = 0
        self.largest = first

    def add(self, allocation: Live) -> None:
        self.live_bytes += allocation.size_bytes
        self.count += 1
        if allocation.size_bytes > self.largest.size_bytes:
            self.largest = allocation


def holders(
    live: Iterable[Live], moment: str, time_us: int | None = None, top_n: int = TOP_N
) -> Holders:
    """Group live allocations by site, largest first, with each site's share."""
    groups: dict[Frame | None, _Group] = {}
    site_cache: dict[Stack, Frame | None] = {}
    for allocation in live:
        stack = allocation.frames
        if stack in site_cache:
            site = site_cache[stack]
        else:
            site = site_cache[stack] = site_of(stack)
        group = groups.get(site)
        if group is None:
            group = groups[site] = _Group(allocation)
        group.add(allocation)
    total = sum(g.live_bytes for g in groups.values())
    ranked = sorted(groups.items(), key=lambda item: -item[1].live_bytes)
    top = tuple(
        Holder(
            site=site,
            live_bytes=group.live_bytes,
            allocations=group.count,
            share=group.live_bytes / total if total else 0.0,
            stack=group.largest.frames,
        )
        for site, group in ranked[:top_n]
    )
    return Holders(
        moment=moment,
        time_us=time_us,
        total_live_bytes=total,
        allocations=sum(g.count for g in groups.values()),
        top=top,
        other_bytes=total - sum(h.live_bytes for h in top),
        sites=len(groups),
    )
