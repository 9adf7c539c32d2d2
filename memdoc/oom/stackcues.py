"""Where in a program a memory error came from, read once from the frames of its stack.

A stack is text too: which library's files it runs through and what its functions are
called say what the program was doing (a backward pass, loading a checkpoint, an optimizer
making its state). Each idea is one table here, of files (a pattern of a library's paths)
and of function names (a pattern for the whole name, or phrases of whole words: "load" is
not in "dataloader"); rules read the answers, never the frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memdoc.oom.frames import file_name, frame_matches, frame_parts, in_file
from memdoc.oom.names import has_words

# A table of where an idea runs: (file pattern, function pattern), either may be "" for any.
Places = tuple[tuple[str, str], ...]

# A training step's passes: PyTorch modules, autograd, Keras.
FORWARD: Places = (
    (
        r"torch[/\\]nn[/\\]modules[/\\]|keras[/\\]",
        r"forward|_call_impl|_wrapped_call_impl|call|__call__",
    ),
)
BACKWARD: Places = (
    (
        r"torch[/\\]autograd[/\\]|torch[/\\]_tensor\.py",
        r"backward|_engine_run_backward|run_backward",
    ),
)
# A PyTorch loss function called by the program's own step (`F.cross_entropy(...)`): the
# end of a step's forward pass, outside any module.
LOSS: Places = (
    (
        r"torch[/\\]nn[/\\]functional\.py",
        r".*(loss|entropy|kl_div|nll|margin|ctc).*",
    ),
)
# PyTorch's data loading.
DATA_LOADING: Places = ((r"torch[/\\]utils[/\\]data[/\\]", ""),)
# Moving or loading a module onto a device: torch's Module.to/cuda/_apply, Hugging Face's
# and accelerate's loading helpers.
MOVING_WEIGHTS: Places = (
    (
        "",
        r"(_apply|to|cuda|to_empty|from_pretrained|_load_pretrained_model|dispatch_model"
        r"|load_checkpoint_and_dispatch|set_module_tensor_to_device"
        r"|_load_state_dict_into_meta_model)",
    ),
)
# torch.load itself.
TORCH_LOAD: Places = ((r"serialization\.py", ""),)
# Building parameters: a torch.nn constructor or initialiser (also under `with
# torch.device`), a Keras layer or model building its weights.
BUILDING_WEIGHTS: Places = (
    (r"torch[/\\]nn[/\\]modules[/\\]", r"__init__|reset_parameters|_reset_parameters"),
    (r"torch[/\\]nn[/\\]init\.py", ""),
    (r"keras[/\\]", r"build|build_wrapper|_maybe_build|_maybe_rebuild|add_weight|add_variable"),
    (r"keras[/\\](?:src[/\\])?initializers[/\\]", ""),
)
# Drawing random values in JAX: `jax.random`, and the initializers of jax.nn, Flax and Haiku.
RANDOM_FILL: Places = (
    (r"jax[/\\]_src[/\\]random(?:\.py|[/\\])", ""),
    (r"jax[/\\]_src[/\\]nn[/\\]initializers\.py", ""),
    (r"flax[/\\](?:linen|nnx)[/\\]", r"init|initializer"),
    (r"haiku[/\\]_src[/\\]initializers\.py", ""),
)
# `torch.no_grad()` / `inference_mode()` used as a decorator.
GRAD_OFF: Places = ((r"autograd[/\\]grad_mode\.py|utils[/\\]_contextlib\.py", ""),)
# Optimizers, and where they create their per-parameter state on the first step.
OPTIMIZER_FILES = r"torch[/\\]optim[/\\]|optax|keras[/\\].*optimizers|bitsandbytes[/\\]optim"
OPTIMIZER: Places = ((OPTIMIZER_FILES, ""),)
OPTIMIZER_STATE_INIT: Places = (
    (
        OPTIMIZER_FILES,
        r"_init_group|_init_state|init_state|_lazy_init|_create_slots|add_slot|build",
    ),
)
# A program's own function that makes an optimizer's state (`init_shampoo`, `adam_init`,
# `create_opt_state`): a hand-written optimizer, outside any library's files.
OPTIMIZER_WORDS = (
    "optimizer",
    "optimiser",
    "opt state",
    "optim state",
    "adam",
    "adamw",
    "adagrad",
    "adafactor",
    "adadelta",
    "rmsprop",
    "shampoo",
    "lamb",
    "lars",
    "lion",
    "sophia",
    "muon",
    "momentum",
    "sgd",
)
MAKING_WORDS = ("init", "initialize", "initialise", "create", "make", "build", "new")
# The Hugging Face `Trainer` adding an evaluation batch's outputs to all those it has kept
# since the evaluation began (for `compute_metrics`).
GATHERING_OUTPUTS: Places = (
    (
        r"transformers[/\\]trainer_pt_utils\.py",
        r"nested_concat|torch_pad_and_concatenate|numpy_pad_and_concatenate|add",
    ),
)
# Loading saved weights: torch.load, safetensors, orbax.
CHECKPOINT_FILES: Places = ((r"torch[/\\]serialization\.py|safetensors|orbax", ""),)
# Activation checkpointing (torch/utils/checkpoint.py) recomputes, it loads nothing.
_RECOMPUTE_FILES = r"torch[/\\]utils[/\\]checkpoint\.py"
# PyTorch's distributed collectives, and NCCL's own frames.
_COLLECTIVE_FILES = r"distributed[/\\]distributed_c10d\.py|torch[/\\]distributed[/\\]|nccl"

# Words of a function that loads (`load`, `from_pretrained`).
LOADING_WORDS = ("from pretrained", "load")
# Words of a function that loads or restores saved weights.
CHECKPOINT_WORDS = (
    "load state dict",
    "load checkpoint",
    "load from state dict",
    "restore",
    "rebuild tensor",
    "load sharded checkpoint",
)
# Words of a convolution's function or op name (`_conv_forward`, `Conv2DBackpropFilter`).
CONV_WORDS = ("conv", "conv1d", "conv2d", "conv3d", "convolution", "conv transpose")
# Words of a function that captures or replays a CUDA graph; any other "graph" is not one.
CAPTURE_WORDS = (
    "capture begin",
    "capture end",
    "cuda graph",
    "cuda graphs",
    "cudagraph",
    "cudagraphs",
    "cudagraphify",
    "graph capture",
    "make graphed callables",
)
# Words of a collective operation's function.
COLLECTIVE_WORDS = (
    "barrier",
    "all reduce",
    "all gather",
    "reduce scatter",
    "broadcast",
    "init process group",
    "new group",
    "new process group",
    "all to all",
)
# Words of an evaluation or generation function's name (`evaluate_model`, `validation_step`).
EVAL_WORDS = (
    "evaluate",
    "evaluation",
    "eval",
    "validate",
    "validation",
    "val step",
    "val epoch",
    "predict",
    "prediction",
    "test step",
    "test epoch",
    "inference",
    "infer",
    "generate",
    "generation",
    "sample",
    "beam search",
    "greedy search",
)
# Words of a script's own name that say it evaluates (`evaluate.py`, `test.py`, `infer.py`).
EVAL_SCRIPT_WORDS = (*EVAL_WORDS, "test")
# A closure the optimizer's step calls back into: the training step's forward and backward
# (Lightning runs `training_step` this way, and so does `optimizer.step(closure)`).
_CLOSURE_WORDS = ("closure", "training step")
_PASS_FUNCTIONS = frozenset({"forward", "backward", "_call_impl", "_wrapped_call_impl"})
# A constructor's name, also as some frozen executables print it ("in init").
_CONSTRUCTORS = frozenset({"__init__", "init"})
# Paths of installed libraries (and memdoc's own wrappers), not the program's code.
_LIBRARY_PATHS = ("site-packages/", "dist-packages/", "/lib/python3", "/memdoc/collectors/")
# A model's own call: the program's frame that called the model is the one outside these.
_MODEL_CALLS = frozenset({"forward", "__call__", "_call_impl", "_wrapped_call_impl"})


@dataclass(frozen=True)
class StackCues:
    """What the frames of a failing stack say the program was doing (outermost first)."""

    phase: str | None = None  # "backward" or "forward": inside that pass of a step
    computing_loss: bool = False  # a PyTorch loss function, outside any module
    data_loading: bool = False  # PyTorch's data loading
    loading: bool = False  # a function that loads (`load`, `from_pretrained`)
    moving_weights: bool = False  # moving or loading a module onto a device
    torch_load: bool = False  # inside torch.load
    building_weights: bool = False  # a constructor or initialiser building parameters
    drawing_random: bool = False  # JAX drawing random values (an initializer)
    in_constructor: bool = False  # the innermost frame is an `__init__`
    convolution: bool = False  # a convolution's function
    collective: bool = False  # a distributed collective
    optimizer: bool = False  # an optimizer's code
    making_optimizer_state: bool = False  # an optimizer creating its per-parameter state
    own_optimizer_state: str | None = None  # the program's own frame making one's state
    optimizer_closure: bool = False  # a closure the optimizer's step called (the step's pass)
    cuda_graph_capture: bool = False  # capturing or replaying a CUDA graph
    gathering_outputs: bool = False  # a loop adding a batch's outputs to those it kept
    loading_checkpoint: bool = False  # loading or restoring saved weights
    evaluation: bool = False  # a function named for evaluation, or an evaluation script
    grad_off: bool = False  # gradients turned off by a decorator
    evaluation_frame: str | None = None  # the innermost frame named for evaluation
    model_caller: str | None = None  # the program's own frame that called the model


def stack_cues(stack: Sequence[str]) -> StackCues:
    """What `stack` ("file:line:function" frames, outermost first) says."""
    if not stack:
        return StackCues()
    functions = [frame_parts(frame)[2] for frame in stack]
    files = [frame_parts(frame)[0] for frame in stack]
    own_optimizer_state = next(
        (
            frame
            for frame, function in zip(reversed(stack), reversed(functions), strict=True)
            if has_words(function, OPTIMIZER_WORDS)
            and has_words(function, MAKING_WORDS)
            and _own_code(frame)
        ),
        None,
    )
    return StackCues(
        phase=_phase(stack),
        computing_loss=_runs_in(stack, LOSS),
        data_loading=_runs_in(stack, DATA_LOADING),
        loading=_any_named(functions, LOADING_WORDS),
        moving_weights=_runs_in(stack, MOVING_WEIGHTS),
        torch_load=_runs_in(stack, TORCH_LOAD),
        building_weights=_runs_in(stack, BUILDING_WEIGHTS),
        drawing_random=_runs_in(stack, RANDOM_FILL),
        in_constructor=functions[-1] in _CONSTRUCTORS,
        convolution=_any_named(functions, CONV_WORDS),
        collective=any(
            in_file(file, _COLLECTIVE_FILES) and has_words(function, COLLECTIVE_WORDS)
            for file, function in zip(files, functions, strict=True)
        ),
        optimizer=_runs_in(stack, OPTIMIZER) or own_optimizer_state is not None,
        making_optimizer_state=_runs_in(stack, OPTIMIZER_STATE_INIT)
        or own_optimizer_state is not None,
        own_optimizer_state=own_optimizer_state,
        optimizer_closure=_optimizer_closure(files, functions),
        cuda_graph_capture=_any_named(functions, CAPTURE_WORDS),
        gathering_outputs=_runs_in(stack, GATHERING_OUTPUTS),
        loading_checkpoint=_runs_in(stack, CHECKPOINT_FILES)
        or any(
            has_words(file, ["checkpoint"]) and not in_file(file, _RECOMPUTE_FILES)
            for file in files
        )
        or _any_named(functions, CHECKPOINT_WORDS),
        evaluation=_any_named(functions, EVAL_WORDS) or any(map(_eval_script, stack)),
        grad_off=_runs_in(stack, GRAD_OFF),
        evaluation_frame=next(
            (frame for frame in reversed(stack) if has_words(frame_parts(frame)[2], EVAL_WORDS)),
            None,
        ),
        model_caller=_model_caller(stack),
    )


def is_convolution(name: str | None) -> bool:
    """A convolution's op or function name (`Conv2DBackpropFilter`, `_conv_forward`)."""
    return name is not None and has_words(name, CONV_WORDS)


def _phase(stack: Sequence[str]) -> str | None:
    if _runs_in(stack, BACKWARD):
        return "backward"
    if _runs_in(stack, FORWARD):
        return "forward"
    return None


def _runs_in(stack: Sequence[str], places: Places) -> bool:
    return any(
        frame_matches(frame, files, functions) for frame in stack for files, functions in places
    )


def _any_named(functions: Sequence[str], phrases: Sequence[str]) -> bool:
    return any(has_words(function, phrases) for function in functions)


def _optimizer_closure(files: Sequence[str], functions: Sequence[str]) -> bool:
    """The error came from a closure the optimizer's step called, not the optimizer."""
    inner = [i for i, file in enumerate(files) if in_file(file, OPTIMIZER_FILES)]
    if not inner:
        return False
    called = functions[inner[-1] + 1 :]
    return any(
        function.lower() in _PASS_FUNCTIONS or has_words(function, _CLOSURE_WORDS)
        for function in called
    )


def _eval_script(frame: str) -> bool:
    """The top level of a script named for evaluation (`evaluate.py`, `test.py`)."""
    file, _, function = frame_parts(frame)
    return function in ("<module>", "main") and has_words(file_name(file), EVAL_SCRIPT_WORDS)


def _model_caller(stack: Sequence[str]) -> str | None:
    """The innermost frame of the program's own code that is not the model's own call: the
    code that called the model."""
    for frame in reversed(stack):
        if _own_code(frame) and frame_parts(frame)[2] not in _MODEL_CALLS:
            return frame
    return None


def _own_code(frame: str) -> bool:
    """A frame of the program's own code: not an installed library's, not memdoc's."""
    path = frame_parts(frame)[0].replace("\\", "/")
    return not any(part in path for part in _LIBRARY_PATHS) and not path.startswith("memdoc/")
