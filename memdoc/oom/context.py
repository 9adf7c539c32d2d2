"""What the lines around an error tell: its phase (load, eval, train, compile, init), framework."""

from __future__ import annotations

from memdoc.oom.logtext import LogText, Window
from memdoc.oom.patterns import compile_later

LOOKBACK_LINES = 80
FRAMEWORK_LOOKBACK_LINES = 40

# Frame and source lines that show what the program was doing. The innermost (last) one
# in the traceback wins: a `from_pretrained` called inside `evaluate` is a load.
_PHASE = compile_later(
    r"(?P<load>torch\.load\(|\bin (?:load|_load|load_state_dict|from_pretrained|load_checkpoint"
    r"|load_model|_load_pretrained_model|load_sharded_checkpoint)\b|\.load_state_dict\("
    r"|\.from_pretrained\(|Loading checkpoint shards|load_checkpoint\(|\bloading state[ _]dict"
    r"|safetensors\.torch\.load|torch/serialization\.py"
    # in words: "OOM when loading optimizer state dict", "killed while loading the model"
    r"|\b(?:when|while|during|on)\s+load(?:ing)?\s+(?:the\s+|a\s+|an\s+)?(?:[\w-]+\s+){0,2}?"
    r"(?:state[ _]dicts?|checkpoints?|weights|model|shards)\b)"
    r"|(?P<eval>\bin (?:evaluate|evaluation_loop|eval_step|_eval_step|evaluate_step|validate"
    r"|validation_step|_validation_step|validation_loop|run_validation|predict"
    r"|predict_step|prediction_step|test_step|generate|_sample|beam_search|greedy_search)\b"
    r"|__inference_(?:predict|test)_function|\.generate\(|\.predict\(|\.evaluate\("
    # in words: "out of memory during validation", "even on single image inference"
    r"|\b(?:during|while|when|on|at|in)\s+(?:the\s+|an?\s+)?(?:[\w-]+\s+){0,2}?"
    r"(?:validation|validating|evaluation|evaluating|testing|inference|predicting)\b)"
    r"|(?P<compile>\bin (?:compile_fx|compile_fx_inner|fx_codegen_and_compile|backend_compile"
    r"|compile_or_get_cached|_cached_compilation|lower_sharding_computation)\b)"
    r"|(?P<init>cuDevicePrimaryCtxRetain|cuCtxCreate|failed call to cuInit"
    r"|CUDA driver error: out of memory|failed initializing StreamExecutor"
    r"|CUDA runtime implicit initialization on \S{1,20} failed\. Status: out of memory"
    # PyTorch's lazy CUDA start-up: old builds made the random generators' states first
    r"|THCTensorRandom\.cu|\bin _lazy_init\b|torch\._C\._cuda_init\(\))"
    r"|(?P<train>\bin (?:train_step|training_step|_training_step|train_one_epoch|train_epoch"
    r"|backward|fit|train)\b|__inference_train_function|\.backward\(|optimizer\.step\()"
)
# The error's own text can run on for a few lines ("[Op:__inference_train_function_1]").
AFTER_LINES = 12
_TRACEBACK_START = "Traceback (most recent call last)"

# Substrings that name the framework, checked in this order: jaxlib vendors TensorFlow
# sources (`external/org_tensorflow`), so JAX cues come first; Torch7 lives in `torch/install`,
# so it comes before PyTorch. Frameworks memdoc does not watch (Torch7, Caffe, MXNet, Darknet)
# are named too: none of them preallocates the device, which rules out that cause.
_FRAMEWORK_CUES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch7", ("luajit", "torch7/", "luarocks")),
    (
        "jax",
        (
            "jaxlib",
            "jax._src",
            "jax/_src",
            "site-packages/jax/",
            "xlaruntimeerror",
            "jaxruntimeerror",
            "xla_extension",
            "external/org_tensorflow",
            "external/xla/xla/",  # OpenXLA as jaxlib builds it (TensorFlow's is local_xla)
            "jax.errors",
        ),
    ),
    (
        "pytorch",
        (
            "torch.",
            "torch/",
            "pytorch",
            "c10::",
            "c10/",
            "runtimeerror: cuda error",  # c10's C10_CUDA_CHECK wording
            "runtimeerror: cudnn error",  # ATen's cuDNN check
            "cuda kernel errors might be asynchronously reported",
        ),
    ),
    (
        "tensorflow",
        ("tensorflow", "keras", "errors_impl", "op_requires", "[op:", "{{node", 'op_type="'),
    ),
    ("caffe", ("caffe::", "syncedmem.cpp", "/caffe/", "pycaffe", "caffe.bin")),
    ("mxnet", ("mxnet", "pooled_storage_manager")),
    ("darknet", ("darknet",)),
)


def phase_at(log: LogText, line: int, end: int | None = None) -> str | None:
    """The phase the traceback above `line` (or the error text up to `end`) shows, if any."""
    found: str | None = None
    start = max(0, line - LOOKBACK_LINES)
    # Only the traceback that ends here: stop at its header.
    for index in range(line - 1, start - 1, -1):
        if _TRACEBACK_START in log.head(index):
            start = index
            break
    last = min(end if end is not None else line, line + AFTER_LINES)
    for index in range(start, last + 1):
        for match in _PHASE.finditer(log.head(index)):
            found = match.lastgroup
    return found


def guess_framework(log: LogText, line: int, window: Window | None = None) -> str | None:
    """The framework the error text names, else the one the traceback above names."""
    if window is not None:
        found = framework_in(" ".join(window.parts)[:4000].lower())
        if found is not None:
            return found
    start = max(0, line - FRAMEWORK_LOOKBACK_LINES)
    lookback = " ".join(log.lower_head(index, 300) for index in range(start, line))
    return framework_in(lookback)


def framework_in(lowered: str) -> str | None:
    for framework, cues in _FRAMEWORK_CUES:
        if any(cue in lowered for cue in cues):
            return framework
    return None
