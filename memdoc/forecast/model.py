"""What a forecast says, and the per-step peaks it is made from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class StepSeries:
    """Per-step peaks of one measured quantity, and the limit it runs into.

    `steps`, `times_s` and `peak_bytes` are parallel: the step number, the time of its
    boundary (seconds since the trace started) and the highest value seen during the step.
    """

    metric: str
    limit_bytes: float
    limit_label: str  # "address-space cap (RLIMIT_AS)", "GPU 0 total", …
    steps: Sequence[int]
    times_s: Sequence[float]
    peak_bytes: Sequence[float]
    device: int | None = None
    pid: int | None = None
    # The last step the loop will run, where it said so (Keras `fit`: epochs × batches).
    planned_end_step: int | None = None
    # Where the loop said its epochs' length and runs more than one: the last step before
    # its first, and the steps of an epoch. What fills once, in the first epoch (a dataset
    # cached in memory as it is first read), is told from a leak by the epochs after it.
    loop_start_step: int | None = None
    epoch_steps: int | None = None


@dataclass(frozen=True)
class Forecast:
    """When the per-step peak will cross the limit, at the growth seen so far.

    Steps and seconds come as a central value and a 90% interval (`_early`, `_late`).
    Seconds are counted from `t_s`, the time of the last step used; they are None when
    the steps' pace is unknown.
    """

    metric: str
    limit_label: str
    limit_bytes: int
    t_s: float
    step: int  # the last step the forecast saw
    current_bytes: int  # the fitted per-step peak at that step
    growth_bytes_per_step: float
    growth_low_bytes_per_step: float
    growth_high_bytes_per_step: float
    oom_step: int
    oom_step_early: int
    oom_step_late: int
    eta_s: float | None
    eta_early_s: float | None
    eta_late_s: float | None
    seconds_per_step: float | None
    warmup_steps: int  # leading steps left out as warm-up
    points: int  # steps the line was fitted through
    device: int | None = None
    pid: int | None = None

    @property
    def steps_left(self) -> int:
        return max(self.oom_step - self.step, 0)

    def to_data(self) -> dict[str, Any]:
        """The `data` of a `forecast` trace event (unknown values left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Forecast | None:
        """Inverse of `to_data`; None when the event lacks a required field."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        optional = ("eta_s", "eta_early_s", "eta_late_s", "seconds_per_step", "device", "pid")
        for name in optional:
            kwargs.setdefault(name, None)
        try:
            return cls(**kwargs)
        except TypeError:
            return None


@dataclass(frozen=True)
class NoForecast:
    """Why there is no forecast: `reason` is one of the constants below, `detail` for people."""

    reason: str
    detail: str
    points: int = 0
    judged_at_step: int | None = None  # where the reason may no longer hold, if known


NO_LIMIT = "no-limit"
TOO_FEW_STEPS = "too-few-steps"
NO_GROWTH = "no-growth"
BEYOND_REACH = "beyond-reach"  # growth, but the limit lies far past what was measured
ENDS_FIRST = "ends-first"  # growth, but the loop ends before it reaches the limit
FIRST_EPOCH = "first-epoch"  # growth in the first epoch only so far, the limit past it
