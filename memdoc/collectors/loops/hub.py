"""Where the loop hooks report: the sessions of this process, a phase stack, and the patching
rule every hook follows (wrap once, keep the original's name and signature, never raise)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from memdoc.collectors.own import heap_free, own_memory

if TYPE_CHECKING:
    from memdoc.collectors.base import SessionHandle

F = TypeVar("F", bound=Callable[..., Any])

# Phases a loop can be in. A phase begins with a mark named after it; when a phase nested
# in another ends (validation inside fit), a mark names the outer phase again; when the
# outermost one ends, the mark `PHASE_ENDED` says no loop phase is running.
TRAIN = "train"
EVAL = "eval"
PREDICT = "predict"
SEARCH = "batch-size search"
PHASE_ENDED = "phase ended"

_WRAPPED = "__memdoc_wrapped__"

_lock = threading.Lock()
_sessions: list[SessionHandle] = []
_phases: list[str] = []
_plans_said: list[dict[str, int]] = []  # the plan the last phase mark or plan mark said


def subscribe(session: SessionHandle) -> None:
    with _lock:
        if session not in _sessions:
            _sessions.append(session)


def unsubscribe(session: SessionHandle) -> None:
    with _lock:
        if session in _sessions:
            _sessions.remove(session)


def listening() -> bool:
    return bool(_sessions)


def _each() -> list[SessionHandle]:
    with _lock:
        return list(_sessions)


def raised(exc: BaseException, depth: int = 1) -> None:
    """A loop call memdoc wraps raised `exc`: every session notes it, in case it is a memory
    error the program then catches (a retry at a smaller batch around `fit`). `depth`: the
    frames from the caller of this function out to the wrapper the program called."""
    if isinstance(exc, Exception) and _sessions:
        with contextlib.suppress(Exception):
            # A session listens, so its collectors are loaded already: `import memdoc`
            # alone (the hooks' installer) does not load them.
            from memdoc.collectors.base import note_raised

            note_raised(_each(), exc, depth=depth + 1)


def handling(exc: BaseException) -> None:
    """The program called what an OOM handler calls while it handled `exc`: every session
    notes it, in case it is a memory error (noted once, whatever else saw it too)."""
    if isinstance(exc, Exception) and _sessions:
        for session in _each():
            with contextlib.suppress(Exception):
                session.note_raised(exc)


def step(source: str, **data: Any) -> None:
    """A step of a framework's loop, to every session. A session may end the program here
    (a headroom probe stops after N steps by raising SystemExit): that is let through."""
    for session in _each():
        with contextlib.suppress(Exception):
            session.step(source, **data)


def mark(label: str, **data: Any) -> None:
    from memdoc.trace.model import EventKind

    for session in _each():
        with contextlib.suppress(Exception):
            session.emit(EventKind.MARK, {"label": label, **data})


# Each batch-size finder's last size tried, for the error it may then catch.
_tried: dict[str, int] = {}


def finder_mark(finder: str, size: int, *, answer: str = "") -> None:
    """A batch-size finder's try at `size` ("batch size 64"), or its answer ("batch size 64
    trained", "... chosen") when `answer` says how the finder knows it. The trace's reader
    (`memdoc.trace.phases.batch_search`) reads these marks."""
    if not answer:
        _tried[finder] = size
    label = f"batch size {size} {answer}".rstrip()
    data: dict[str, Any] = {"batch_size": size, "source": finder, "finder": finder}
    if answer:
        data["chosen"] = True
    mark(label, **data)


def model_state(data: dict[str, Any]) -> None:
    """What a loop's model holds (`param_bytes`, `dtype_bytes`), as a `model_state` event."""
    from memdoc.trace.model import EventKind

    for session in _each():
        with contextlib.suppress(Exception):
            session.emit(EventKind.MODEL_STATE, data)


def caught(exc: BaseException, finder: str) -> None:
    """A memory error a loop's own batch-size finder caught: recorded as caught, with the
    size it tried (the last it marked). The finder's frame, still handling the error, is
    not read: its locals' snapshot would keep the error, and the failed try's tensors, alive
    while it tries again (see `memdoc.collectors.base.running_frames`)."""
    data = {"batch_size": _tried.get(finder), "finder": finder}
    for session in _each():
        with contextlib.suppress(Exception):
            session.record_exception(exc, exc.__traceback__, where="caught", context=data)


def _memory() -> dict[str, Any]:
    """What a phase mark carries: the process's own memory and, where the program uses a
    CUDA device, the live tensors' bytes there (`device`)."""
    from memdoc.collectors.torch_cuda import device_memory

    host: dict[str, int] = own_memory()
    free = heap_free()
    if free is not None:
        host["heap_free_bytes"] = free
    out: dict[str, Any] = {"host": host}
    device = device_reader() if device_reader is not None else device_memory()
    if device:
        out["device"] = device
    return out


# Replaced in tests by a reader over a stand-in CUDA gate; None reads the real one.
device_reader: Callable[[], dict[str, int]] | None = None


def enter(
    phase: str,
    source: str,
    *,
    grad_enabled: bool | None,
    planned_steps: int | None = None,
    epoch_steps: int | None = None,
) -> None:
    """A loop began `phase`; `grad_enabled` is False where the loop itself turns gradients
    off (every framework's evaluation does), None where memdoc cannot tell; `planned_steps`
    the steps the loop will run when it knows (Keras `fit`: epochs times batches), so that
    a forecast past its end is no warning, and `epoch_steps` those of one epoch, so that
    what fills once in the first epoch is told from a leak. The mark carries the process's
    own memory at that instant, so that what a phase kept is measured exactly however
    short it was."""
    plan = _plan(planned_steps, epoch_steps)
    with _lock:
        _phases.append(phase)
        _plans_said[:] = [plan]
    mark(phase, phase=phase, source=source, grad_enabled=grad_enabled, **plan, **_memory())


def planned(source: str, planned_steps: int | None, epoch_steps: int | None = None) -> None:
    """A training loop's plan, said where the loop learns it only after its phase began
    (Lightning and the `Trainer` count their steps from the data they set up inside it): a
    mark of its own, not a phase mark, read by the forecast as a phase mark's plan is."""
    plan = _plan(planned_steps, epoch_steps)
    with _lock:
        if not plan or plan in _plans_said:  # the phase's mark said it (a finder's trial)
            return
        _plans_said[:] = [plan]
    if not listening():
        return
    words = f"{plan['planned_steps']:,} steps planned"
    if "epoch_steps" in plan:
        words += f", {plan['epoch_steps']:,} an epoch"
    mark(f"{TRAIN}: {words}", source=source, **plan)


def _plan(planned_steps: int | None, epoch_steps: int | None) -> dict[str, int]:
    """A mark's plan: the steps the loop will run, and those of one epoch where it runs
    more than one."""
    if not isinstance(planned_steps, int) or planned_steps <= 0:
        return {}
    plan = {"planned_steps": planned_steps}
    if isinstance(epoch_steps, int) and 0 < epoch_steps < planned_steps:
        plan["epoch_steps"] = epoch_steps
    return plan


def leave(phase: str, source: str, *, failed: bool = False) -> None:
    """The loop's `phase` ended: the phase around it, if any, goes on. A phase an error
    ended leaves no mark: the error belongs to the phase it came from, and whatever the
    program does next marks its own phase."""
    with _lock:
        if phase in _phases:
            del _phases[len(_phases) - 1 - _phases[::-1].index(phase) :]
        outer = _phases[-1] if _phases else None
    if failed:
        return
    if outer is None:
        mark(PHASE_ENDED, phase=None, ended=phase, source=source, **_memory())
    else:
        mark(outer, phase=outer, source=source, resumed=True, **_memory())


def current_phase() -> str | None:
    with _lock:
        return _phases[-1] if _phases else None


def wrap(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> bool:
    """Replace `owner.name` by `make(original)` once; the wrapper keeps the original's name,
    docs and signature. False when there is nothing to wrap or it was wrapped already."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, _WRAPPED, False):
        return False
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _WRAPPED, True)
    setattr(owner, name, wrapper)
    return True


def in_phase(
    phase: str,
    source: str,
    grad_enabled: bool | None,
    call: Callable[..., Any],
    *args: Any,
    _memdoc_plan: Callable[..., int | None] | None = None,
    **kwargs: Any,
) -> Any:
    """`call(*args, **kwargs)` as one phase of a loop: marked when it begins and ends (an
    error leaves the phase it came from in force); a plain call while no session listens.
    `_memdoc_plan(*args)` says how many steps the phase will run, where the loop knows (the
    name keeps it apart from any keyword of the loop's own method)."""
    if not listening():
        return call(*args, **kwargs)
    planned = None
    if _memdoc_plan is not None:
        with contextlib.suppress(Exception):
            planned = _memdoc_plan(*args)
    enter(phase, source, grad_enabled=grad_enabled, planned_steps=planned)
    try:
        result = call(*args, **kwargs)
    except BaseException as exc:
        leave(phase, source, failed=True)
        raised(exc, depth=2)
        raise
    leave(phase, source)
    return result


def around(
    phase: str,
    source: str,
    *,
    grad_enabled: bool | None,
    plan: Callable[..., int | None] | None = None,
) -> Callable[[F], F]:
    """A wrapper maker for a method that runs one phase of a loop (see `in_phase`)."""

    def make(original: F) -> F:
        def run_phase(*args: Any, **kwargs: Any) -> Any:
            return in_phase(
                phase, source, grad_enabled, original, *args, _memdoc_plan=plan, **kwargs
            )

        return run_phase  # type: ignore[return-value]

    return make


def after(report: Callable[..., None]) -> Callable[[F], F]:
    """A wrapper maker that calls the original, then `report(*args, **kwargs)`."""

    def make(original: F) -> F:
        def then_report(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if listening():
                with contextlib.suppress(Exception):
                    report(*args, **kwargs)
            return result

        return then_report  # type: ignore[return-value]

    return make
