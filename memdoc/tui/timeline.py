"""An index of a trace's events by kind and time, kept up to date as the trace grows."""

from __future__ import annotations

import bisect
from array import array

from memdoc.trace import Event, EventKind, Trace
from memdoc.trace.model import USER_STEP


class EventIndex:
    """Steps, marks and OOMs by time, so that each refresh costs a bisection, not a scan.

    Events are only ever appended to a trace, so `update` reads only the new ones. Build a
    new index for a different trace (a replay prefix).
    """

    def __init__(self) -> None:
        self._seen = 0
        self._step_pid: int | None = None
        self._has_steps = False
        self._user_steps = False
        self.step_times: array[float] = array("d")
        self.step_numbers: list[int] = []
        self.mark_times: array[float] = array("d")
        self.marks: list[Event] = []
        self.oom_times: array[float] = array("d")
        self.ooms: list[Event] = []
        self.frameworks: set[str] = set()  # frameworks the program imported

    def update(self, trace: Trace) -> None:
        for event in trace.iter_events(self._seen):
            self._add(event)
            self._seen += 1

    def _add(self, event: Event) -> None:
        if event.kind == EventKind.STEP:
            # Like Trace.steps(): when several processes count steps, follow the first.
            if not self._has_steps:
                self._has_steps, self._step_pid = True, event.pid
            if event.pid != self._step_pid:
                return
            user = event.data.get("source") == USER_STEP
            if user and not self._user_steps:  # the program's own steps win from here on
                self._user_steps = True
                self.step_times, self.step_numbers = array("d"), []
            elif self._user_steps and not user:
                return
            number = event.data.get("step")
            self.step_times.append(event.t)
            self.step_numbers.append(
                number if isinstance(number, int) else len(self.step_numbers) + 1
            )
        elif event.kind == EventKind.MARK:
            self.mark_times.append(event.t)
            self.marks.append(event)
        elif event.kind == EventKind.OOM:
            self.oom_times.append(event.t)
            self.ooms.append(event)
        elif event.kind == EventKind.FRAMEWORK and event.data.get("name"):
            self.frameworks.add(str(event.data["name"]))

    def step_at(self, t: float) -> int | None:
        """The number of the last step that ended at or before `t`."""
        i = bisect.bisect_right(self.step_times, t)
        return self.step_numbers[i - 1] if i else None

    def mark_at(self, t: float) -> Event | None:
        """The last mark at or before `t` (the phase the program said it is in)."""
        i = bisect.bisect_right(self.mark_times, t)
        return self.marks[i - 1] if i else None

    def ooms_until(self, t: float) -> list[Event]:
        return self.ooms[: bisect.bisect_right(self.oom_times, t)]

    @staticmethod
    def between(times: array[float], t0: float, t1: float) -> array[float]:
        return times[bisect.bisect_left(times, t0) : bisect.bisect_right(times, t1)]
