"""When a headroom probe has run long enough: its per-step peak has stopped rising."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# A peak counts as risen when it grows by more than this share of itself, and more than
# RISE_FLOOR_BYTES: the interpreter's own small allocations move it a little every step.
RISE_SHARE = 0.005
RISE_FLOOR_BYTES = 1 << 20


@dataclass
class SettleRule:
    """Ends a probe once it has run `min_steps` steps and `quiet_steps` steps in a row have
    not raised any of its peaks (high-water marks: address space, resident memory, each
    framework's pool), and never inside an evaluation; at `max_steps`, or `max_s` seconds
    after its first step, it ends whatever the peaks do.

    A peak is read at each step: a high-water mark covers everything between two steps, the
    optimizer's first step and an evaluation included, so the step after them sees it.
    """

    min_steps: int
    quiet_steps: int
    max_steps: int
    max_s: float
    peaks: dict[str, float] = field(default_factory=dict)
    last_rise_step: int = 0
    started_s: float | None = None
    why: str = ""

    def observe(self, step: int, now_s: float, peaks: Mapping[str, float]) -> None:
        """Take the peaks read at the end of `step` (monotonic seconds `now_s`)."""
        if self.started_s is None:
            self.started_s = now_s
        for key, value in peaks.items():
            before = self.peaks.get(key)
            if before is None or value > before + max(RISE_FLOOR_BYTES, RISE_SHARE * before):
                self.last_rise_step = step
            if before is None or value > before:
                self.peaks[key] = value

    def done(self, step: int, now_s: float, *, evaluating: bool = False) -> bool:
        """True when the probe should end at `step`; `why` then says which rule ended it."""
        if step >= self.max_steps:
            self.why = "step cap"
            return True
        if step < self.min_steps or evaluating:
            return False
        if step - self.last_rise_step >= self.quiet_steps:
            self.why = "settled"
            return True
        if self.started_s is not None and now_s - self.started_s >= self.max_s:
            self.why = "time cap"
            return True
        return False

    @property
    def settled(self) -> bool:
        return self.why == "settled"
