"""The phases of a run as its training loops reported them: train, eval, predict, a
batch-size search, each with the process's own memory where it began and ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memdoc.trace.model import Event
    from memdoc.trace.reader import Trace

# Phases are marks a loop wrote with a `phase` key (see memdoc.collectors.loops); `phase`
# is None in the mark that says no loop phase runs any more.
EVAL_PHASES = ("eval", "predict")


@dataclass(frozen=True)
class Phase:
    """One stretch of one phase in one process, from its mark to the next phase mark of
    that process (or the end of the recording)."""

    name: str
    pid: int | None
    t0: float
    t1: float
    source: str
    grad_enabled: bool | None  # False where the loop itself turned gradients off
    rss_start: int | None  # the process's resident bytes when the phase began
    rss_end: int | None  # ... when the next phase mark came; None at the end of the trace
    # (device index, live tensors' bytes there) at the phase's start and end, where the
    # program used a CUDA device by then.
    device_start: tuple[int, int] | None = None
    device_end: tuple[int, int] | None = None
    # What the C heap held freed, for later, at the start and the end (glibc).
    heap_free_start: int | None = None
    heap_free_end: int | None = None

    @property
    def evaluating(self) -> bool:
        return self.name in EVAL_PHASES

    @property
    def kept_bytes(self) -> int | None:
        """Memory the phase added and had not given back when it ended: the resident memory
        it added, less what the C heap added to the freed memory it keeps, where both marks
        read it (an evaluation whose temporaries were freed leaves the process larger by
        them, though it keeps nothing)."""
        if self.rss_start is None or self.rss_end is None:
            return None
        added = self.rss_end - self.rss_start
        if self.heap_free_start is not None and self.heap_free_end is not None:
            added -= self.heap_free_end - self.heap_free_start
        return added

    @property
    def kept_on_device(self) -> tuple[int, int] | None:
        """(device, live tensors' bytes the phase added there and had not freed at its end);
        None where either end was not read or the device changed."""
        if self.device_start is None or self.device_end is None:
            return None
        if self.device_start[0] != self.device_end[0]:
            return None
        return self.device_start[0], self.device_end[1] - self.device_start[1]

    def holds(self, t: float) -> bool:
        return self.t0 <= t < self.t1


def phases(trace: Trace) -> list[Phase]:
    """Every loop phase of the trace, in time order per process."""
    by_pid: dict[int | None, list[Event]] = {}
    for mark in trace.marks():
        if mark.is_phase_mark:
            by_pid.setdefault(mark.pid, []).append(mark)
    out: list[Phase] = []
    for pid, marks in by_pid.items():
        for mark, after in zip(marks, [*marks[1:], None], strict=True):
            name = mark.data.get("phase")
            if not isinstance(name, str):
                continue
            out.append(
                Phase(
                    name=name,
                    pid=pid,
                    t0=mark.t,
                    t1=after.t if after is not None else max(trace.duration_s, mark.t),
                    source=str(mark.data.get("source") or ""),
                    grad_enabled=_flag(mark.data.get("grad_enabled")),
                    rss_start=_host_figure(mark.data, "rss_bytes"),
                    rss_end=_host_figure(after.data, "rss_bytes") if after is not None else None,
                    device_start=_device(mark.data),
                    device_end=_device(after.data) if after is not None else None,
                    heap_free_start=_host_figure(mark.data, "heap_free_bytes"),
                    heap_free_end=(
                        _host_figure(after.data, "heap_free_bytes") if after is not None else None
                    ),
                )
            )
    return sorted(out, key=lambda p: p.t0)


def phase_at(
    trace: Trace, t: float, pid: int | None = None, *, known: list[Phase] | None = None
) -> Phase | None:
    """The loop phase `pid` (any process when None) was in at `t`, if a loop reported one;
    `known`: the trace's phases, where the caller has read them already."""
    every = phases(trace) if known is None else known
    found = [p for p in every if (pid is None or p.pid == pid) and p.t0 <= t]
    if not found:
        return None
    last = found[-1]
    return last if t <= last.t1 or last.t1 >= trace.duration_s else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _host_figure(data: Any, name: str) -> int | None:
    """A figure of the process's own memory a mark carries (`rss_bytes`...)."""
    host = data.get("host") if hasattr(data, "get") else None
    value = host.get(name) if isinstance(host, dict) else None
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _device(data: Any) -> tuple[int, int] | None:
    device = data.get("device") if hasattr(data, "get") else None
    if not isinstance(device, dict):
        return None
    index, allocated = device.get("index"), device.get("allocated_bytes")
    if isinstance(index, bool) or isinstance(allocated, bool):
        return None
    if not isinstance(index, int) or not isinstance(allocated, int):
        return None
    return index, allocated


@dataclass(frozen=True)
class BatchSearch:
    """A batch-size finder's search as the loop reported it: the sizes it tried in order,
    those that ran out of memory, and the one that then trained."""

    finder: str
    tried: tuple[int, ...]
    ran_out: tuple[int, ...]
    trained: int | None
    try_marks: tuple[tuple[float, int], ...] = ()  # (when, size) of each try, in order
    chosen_t: float | None = None  # when the finder gave its answer, if it said so

    @property
    def try_times(self) -> tuple[float, ...]:
        return tuple(t for t, _ in self.try_marks)


def changes_batch_size(mark: Event) -> bool:
    """A batch-size finder's try at a size, or its answer: the steps after it run at
    another size than those before it, so memory that rose across the two is no trend."""
    return isinstance(mark.data.get("batch_size"), int) and bool(mark.data.get("finder"))


def batch_search(trace: Trace) -> BatchSearch | None:
    """The finder's search, when a finder reported its tries (`batch size N` marks). A try
    ran out when a memory error came before the next try (or the finder's answer); the
    size that trained is the finder's answer where it gave one, else the last try when no
    error came after it and the run went on to steps or exited 0."""
    marks = [
        m
        for m in trace.marks()
        if isinstance(m.data.get("batch_size"), int) and m.data.get("finder")
    ]
    tries = [(m.t, int(m.data["batch_size"])) for m in marks if not m.data.get("chosen")]
    chosen = [(m.t, int(m.data["batch_size"])) for m in marks if m.data.get("chosen")]
    if not tries:
        return None
    oom_times = sorted(e.t for e in trace.oom_events())
    ends = [t for t, _ in tries[1:]] + [chosen[0][0] if chosen else float("inf")]
    ran_out = tuple(
        size
        for (t, size), end in zip(tries, ends, strict=True)
        if any(t <= o < end for o in oom_times)
    )
    return BatchSearch(
        finder=str(marks[0].data["finder"]),
        tried=tuple(size for _, size in tries),
        ran_out=ran_out,
        trained=chosen[0][1] if chosen else _last_try_trained(trace, tries[-1], oom_times),
        try_marks=tuple(tries),
        chosen_t=chosen[0][0] if chosen else None,
    )


def _last_try_trained(trace: Trace, last: tuple[float, int], oom_times: list[float]) -> int | None:
    last_t, last_size = last
    if any(o >= last_t for o in oom_times):
        return None
    went_on = any(t > last_t for t in trace.steps().times()) or (
        trace.exit is not None and trace.exit.status == 0
    )
    return last_size if went_on else None
