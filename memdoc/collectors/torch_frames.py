"""Which PyTorch module's forward a memory error came out of, read from its traceback.

At the error the traceback still holds the frames it passed through, and with them the
modules that were running (`self` of each `forward`) and the tensors they held. Two facts
the text of the error cannot give are read there: whether that module was in training or in
evaluation mode, and whether autograd was recording (a tensor in those frames has a
`grad_fn`). A model in evaluation mode that records a graph is running inference without
`torch.no_grad()`. The model in hand is read there too, for a failure outside any module's
forward (a backward pass): the largest module the frames hold, and its parameters' bytes.
Only attributes are read; nothing is changed or kept.
"""

from __future__ import annotations

from inspect import CO_NEWLOCALS
from types import FrameType
from typing import Any

from memdoc.collectors.base import running_frames

# The functions a module call runs through: its own `forward` and nn.Module's call wrappers.
FORWARD_CALLS = frozenset({"forward", "_call_impl", "_wrapped_call_impl"})
# The most frames of a traceback looked at (an OOM's traceback is a few dozen).
MAX_FRAMES = 300
# The most parameters counted of one module (a large model has a few thousand tensors).
MAX_PARAMETERS = 100_000


def module_in_hand(exc: BaseException, torch: Any) -> dict[str, Any] | None:
    """The module whose forward `exc` came out of: the outermost one in evaluation mode, when
    none above it trains (a frozen batch norm inside a training model is not one), else the
    outermost; with `training`, and for one in evaluation mode `recording_graph`. None when
    no module's forward is in the traceback."""
    frames = _frames(exc)
    calls = _module_calls(frames, torch.nn.Module)
    if not calls:
        return None
    evaluating = next((n for n, (_, module) in enumerate(calls) if not module.training), None)
    if evaluating is None or any(module.training for _, module in calls[:evaluating]):
        outermost = calls[0][1]
        return {"module": type(outermost).__qualname__, "training": bool(outermost.training)}
    index, module = calls[evaluating]
    return {
        "module": type(module).__qualname__,
        "training": False,
        "recording_graph": _recording(frames[index:], torch.Tensor),
    }


def _frames(exc: BaseException) -> list[FrameType]:
    """The traceback's frames whose locals may be read, outermost first: not a function's
    frame that is still running (the one handling the error, a wrapper re-raising it), see
    `running_frames`; a module's frame reads its globals."""
    running = running_frames()
    frames: list[FrameType] = []
    tb = exc.__traceback__
    while tb is not None and len(frames) < MAX_FRAMES:
        frame = tb.tb_frame
        if id(frame) not in running or not frame.f_code.co_flags & CO_NEWLOCALS:
            frames.append(frame)
        tb = tb.tb_next
    return frames


def _module_calls(frames: list[FrameType], module_type: type) -> list[tuple[int, Any]]:
    """(frame index, module) of each module's forward, outermost first, each module once."""
    found: list[tuple[int, Any]] = []
    seen: set[int] = set()
    for index, frame in enumerate(frames):
        if frame.f_code.co_name not in FORWARD_CALLS:
            continue
        module = frame.f_locals.get("self")
        if isinstance(module, module_type) and id(module) not in seen:
            seen.add(id(module))
            found.append((index, module))
    return found


def _recording(frames: list[FrameType], tensor_type: type) -> bool:
    """A tensor held by these frames was made by autograd-recorded operations."""
    for frame in frames:
        for value in frame.f_locals.values():
            try:
                if isinstance(value, tensor_type) and getattr(value, "grad_fn", None) is not None:
                    return True
            except Exception:  # a tensor subclass may refuse the question
                continue
    return False


def model_in_hand(exc: BaseException, torch: Any) -> dict[str, Any] | None:
    """The largest module (by parameter bytes) that a frame of the traceback holds in its
    locals: the model a loop was training or running (`model` in a training step, `self` in
    a forward). Its class, its parameters' bytes, those that take gradients, and the device
    type of the most of them; None when no frame holds a module with parameters."""
    best: dict[str, Any] | None = None
    seen: set[int] = set()
    for frame in _frames(exc):
        for value in frame.f_locals.values():
            if not isinstance(value, torch.nn.Module) or id(value) in seen:
                continue
            seen.add(id(value))
            counted = _parameter_bytes(value)
            if counted is None or (best and counted["param_bytes"] <= best["param_bytes"]):
                continue
            best = {"module": type(value).__qualname__, **counted}
    return best


def _parameter_bytes(module: Any) -> dict[str, Any] | None:
    total = trainable = 0
    by_device: dict[str, int] = {}
    try:
        for index, param in enumerate(module.parameters()):
            if index >= MAX_PARAMETERS:
                break
            nbytes = int(param.numel()) * int(param.element_size())
            total += nbytes
            trainable += nbytes if param.requires_grad else 0
            by_device[param.device.type] = by_device.get(param.device.type, 0) + nbytes
    except Exception:  # a module may refuse the question
        return None
    if not total:
        return None
    device = max(by_device, key=lambda k: by_device[k])
    return {"param_bytes": total, "trainable_bytes": trainable, "device_type": device}
