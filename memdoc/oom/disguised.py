"""OOMs that do not say OOM: cuDNN/cuBLAS/NCCL/driver failures, NVML assert, TensorRT, MXNet."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from memdoc.kinds import OomKind
from memdoc.oom.context import framework_in, guess_framework
from memdoc.oom.fields import (
    INT,
    SIZE,
    first_group,
    first_known,
    is_huge,
    loose,
    to_bytes,
    to_int,
)
from memdoc.oom.logtext import Hit, LogText, Window, is_source_line, rank_of, strip_prefix
from memdoc.oom.patterns import compile_later
from memdoc.thresholds import little_free
from memdoc.trace.model import OomInfo


@dataclass(frozen=True)
class _Form:
    """A disguised form: its lowercase needle, the library it names, the framework it implies."""

    needle: str
    library: str | None
    framework: str | None = None
    phase: str | None = None  # where the form always comes from ("load": loading a model)
    also: str | None = None  # a second cue the line must hold (lowercase)


# XLA's `RET_CHECK ... dnn != nullptr` is not among them: in real threads a jaxlib built for
# another CUDA or cuDNN gives it, not memory.
# Some of these also have other causes (CUBLAS_STATUS_ALLOC_FAILED after bad embedding
# indices; "DNN library is not found" after a bad install; NCCL's "unhandled system error"
# when /dev/shm is small). Public threads settle them as memory often enough that they are
# reported, as kind "disguised", for the rules to weigh.
# A bare CUDNN_STATUS_NOT_INITIALIZED is not among them: in PyTorch threads a cuDNN that does
# not match the build or the card gives it, not memory. TensorFlow's "Could not create cudnn
# handle: CUDNN_STATUS_NOT_INITIALIZED" still counts, by its own words.
# NCCL's bare "unhandled system error" / "unhandled cuda error" are not among them: sockets,
# drivers and installs give them far more often; they count only when the text says memory.
_FORMS = (
    _Form("cuda error: out of memory", "cuda", "pytorch"),
    _Form("failed to create cublas handle", "cublas", "tensorflow"),
    _Form("cublas_status_alloc_failed", "cublas"),
    _Form("cublas_status_not_initialized", "cublas"),
    _Form("create cublas handle failed", "cublas"),
    _Form("cudnn_status_alloc_failed", "cudnn"),
    _Form("could not create cudnn handle", "cudnn", "tensorflow"),
    _Form("cudnn_status_internal_error", "cudnn"),
    _Form("failed to get convolution algorithm", "cudnn", "tensorflow"),
    _Form("failed to determine best cudnn convolution algorithm", "cudnn", "jax"),
    _Form("dnn library is not found", "cudnn", "jax"),
    _Form("dnn library initialization failed", "cudnn", "jax"),
    _Form("exceeds the memory limit of", "cudnn", "tensorflow"),
    _Form("cuda failure 'out of memory'", "nccl"),
    _Form("failed to cuda calloc", "nccl"),
    _Form("cuda_error_out_of_memory", "cuda"),
    _Form("hip_error_outofmemory", "hip"),
    _Form("hiperroroutofmemory", "hip"),
    _Form("cudaerrormemoryallocation", "cuda"),
    _Form("nvml_success ==", "nvml", "pytorch", also="assert"),
    _Form("dst tensor is not initialized", None, "tensorflow"),
    _Form("error code 2: outofmemory", "trt"),  # TensorRT's builder and runtime
    _Form("exceeded max size of memory object allocation", "opencl"),  # OpenVINO's GPU plugin
    # OpenCL's CL_MEM_OBJECT_ALLOCATION_FAILURE, as LightGBM's GPU build and Boost.Compute
    # print it.
    _Form("memory object allocation failure", "opencl"),
    _Form("cl_mem_object_allocation_failure", "opencl"),
    # vLLM at start-up: what gpu_memory_utilization leaves after the weights and the profiled
    # activations does not hold the KV cache of one sequence of max_model_len tokens.
    _Form("tokens that can be stored in kv cache", "vllm", "pytorch"),
    _Form("no available memory for the cache blocks", "vllm", "pytorch"),
    _Form("than the available kv cache memory", "vllm", "pytorch"),
    # PyTorch when every cuDNN algorithm failed, most often for lack of workspace memory.
    _Form("unable to find a valid cudnn algorithm to run convolution", "cudnn", "pytorch"),
    # llama.cpp / ggml could not place the model's weights; Transformers' device_map had to
    # put quantized weights off the GPU.
    _Form("unable to allocate backend buffer", "cuda", None, "load"),
    _Form("enough gpu ram to fit the quantized model", "cuda", "pytorch", "load"),
    # TensorFlow's driver layer, also when a thread cut the line before its
    # "from device: CUDA_ERROR_OUT_OF_MEMORY".
    _Form("] failed to allocate ", "cuda", "tensorflow", also="cuda_driver"),
    # The same layer on ROCm: "rocm_driver.cc:601] failed to allocate 7.35G (7889485824
    # bytes) from device: hipError_t(1002)" (1002: HIP's old code for a failed allocation).
    _Form("] failed to allocate ", "hip", "tensorflow", also="rocm_driver"),
    # RAPIDS (cuDF, cuML) through RMM: its pool reached its maximum, or the device was full.
    _Form("maximum pool size exceeded", "rmm"),
    _Form("std::bad_alloc: out_of_memory", "rmm"),
    # NVCaffe's GPU memory pool; PaddlePaddle's up-front chunk, and its later OOM message.
    _Form("check failed: try_reserve(", "cuda"),
    _Form("enforce allocating < available failed", "cuda"),
    _Form("out of memory error on gpu", "cuda"),
    # Vulkan's own code (MLC LLM, ncnn, llama.cpp's Vulkan backend).
    _Form("vk_error_out_of_device_memory", "vulkan"),
    # CUDA libraries' status codes for a failed allocation, by name or by number as callers
    # print them (DGL: "CUSPARSE ERROR: 2"; torchvision: "nvjpegDecode failed: 5").
    _Form("cusparse_status_alloc_failed", "cusparse"),
    _Form("cusparse error: 2", "cusparse"),
    _Form("nvjpeg_status_allocator_failure", "nvjpeg"),
    _Form("nvjpegdecode failed: 5", "nvjpeg", "pytorch"),
)
# A cuDNN library that does not match the build fails at start-up with the same words as one
# that found no memory; TensorFlow says so a few lines above.
_CUDNN_MISMATCH = (
    "but source was compiled with",
    "cudnn library needs to have matching",
    "could not load dynamic library 'libcudnn",
    "could not load library libcudnn",
)
MISMATCH_LOOKBACK_LINES = 40
_MEMORY_USAGE = compile_later(r"Memory usage: (\d{1,20}) bytes free, (\d{1,20}) bytes total")
MOSTLY_FREE = 0.5
NATIVE_STACK_LINES = 16
_NATIVE_FRAME = compile_later(r"@\s+0x[0-9a-f]{4,20}\s|\[bt\]\s?\(\d{1,3}\)")
_FALLBACK_NEEDLE = "out of memory"
_REQUESTS = (
    loose(rf"failed to CUDA calloc ({INT}) bytes"),
    loose(rf"enforce allocating < available failed, ({INT}) >="),
    loose(rf"failed to allocate {SIZE} \(({INT}) bytes\)"),
    loose(rf"failed to alloc ({INT}) bytes"),
    loose(rf"Allocating ({INT}) bytes exceeds the memory limit"),
    loose(rf"requested ({INT}) bytes"),
)
_LIMITS = (
    loose(rf"exceeds the memory limit of ({INT}) bytes"),
    loose(rf"max alloc size supported by device is ({INT}) bytes"),
)
_TOTAL = loose(rf"total memory reported: ({INT})")
# PaddlePaddle: "Cannot allocate 1.0GB memory on GPU 0, 15.0GB memory has been allocated and
# available memory is only 500.0MB."
_SIZED_REQUEST = loose(rf"Cannot allocate ({SIZE}) memory on")
_ALLOCATED = loose(rf"({SIZE}) memory has been allocated")
_AVAILABLE = loose(rf"available memory is only ({SIZE})")
_PADDLE_CHUNK = loose(rf"enforce allocating < available failed, {INT} >= ({INT})")
_DEVICE = (
    loose(r"(?:CUDA|ROCM|GPU):(\d{1,4})\b"),
    loose(r"device ordinal (\d{1,4})"),
    loose(r"\bon GPU (\d{1,4})\b"),  # PaddlePaddle: "Out of memory error on GPU 0"
    compile_later(r"^[\w.-]{1,80}:\d{1,10}:\d{1,10} \[(\d{1,4})\]"),  # NCCL's host:pid:tid [dev]
)
# Accelerators named by their model: a line that names one is about device memory
# ("Out of memory error on T4 instance", "RTX 4090", "MI250").
GPU_NAMES = (
    r"\b(?:[TVAHLKP]\d{1,3}|[AH]\d{2,3}[ -]?\d{0,2}GB|RTX|GTX|Quadro|Tesla|TITAN|Jetson|Radeon"
    r"|Instinct|MI\d{3}X?|Arc A\d{3})\b"
)
# The generic fallback: "out of memory" said as an error, not as advice or a warning.
_ERRORISH = compile_later(
    r"error|fail|fatal|exception|abort|unable|cannot|could not|check failed|\boom\b", re.I
)
ADVICE = compile_later(
    r"(?:may|might|could|will|would|avoid|prevent|not|before|without) (?:run|running|go|going)"
    r" out of memory|not a failure",
    re.I,
)
# The words that put a line about memory on a GPU, as (pattern, where it is said): one table
# for every reader that asks whether a line is about a device or the host.
GPU_WORDS = (
    (r"cuda", "CUDA's own names: cudaMalloc, CUDA_ERROR_OUT_OF_MEMORY, libcudart"),
    (r"gpu", "GPU, gpus, GPU_0_bfc (TensorFlow's allocator)"),
    (r"\bhip", "AMD's runtime: hipMalloc, hipErrorOutOfMemory (not 'ship')"),
    (r"rocm", "ROCm, rocm-smi"),
    (r"device", "device, devices, device:0"),
    (r"\bvram\b", "what people call a GPU's memory"),
    (r"\bmps\b", "Apple's Metal backend in PyTorch"),
    (r"显存", "a GPU's memory, in Chinese"),
    (r"cudnn|cublas|nccl|nvinfer|\[trt\]|thrust::", "GPU libraries: TensorRT, Thrust"),
    (GPU_NAMES, "accelerators by their model"),
)
GPU_WORDS_PATTERN = compile_later("|".join(pattern for pattern, _ in GPU_WORDS), re.I)
_LIBRARY_WORDS = (
    ("nccl", "nccl"),
    ("nvinfer", "trt"),
    ("[trt]", "trt"),
    ("tensorrt", "trt"),
    ("cudnn", "cudnn"),
    ("cublas", "cublas"),
)


def find(log: LogText) -> list[Hit]:
    """Every disguised GPU memory failure named by a known form."""
    hits: list[Hit] = []
    claimed: set[int] = set()
    for form in _FORMS:
        for line, column in log.anchors(form.needle):
            if line in claimed:
                continue
            if form.also is not None and form.also not in log.lower_head(line, 2000):
                continue
            claimed.add(line)
            window = log.window(line, column, max_lines=3)
            if is_source_line(window.parts[0]):
                continue
            if form.library == "cudnn" and _version_mismatch_before(log, line):
                continue
            usage = _usage(log, line)
            if _mostly_free(usage):
                continue
            library = form.library
            if library == "cuda" and _cudnn_in_native_stack(log, line):
                library = "cudnn"
            hit = _hit(log, line, window, library, form.framework, phase=form.phase)
            if _jax_handle_not_starved(log, line, hit, usage):
                continue
            hits.append(hit)
    return hits


def _cudnn_in_native_stack(log: LogText, line: int) -> bool:
    """The C++ stack printed under the failure (glog's "@ 0x..." frames, MXNet's "[bt]") is
    inside cuDNN: the memory was for a convolution's algorithm search or workspace."""
    for index in range(line + 1, min(len(log.lines), line + NATIVE_STACK_LINES)):
        frame = log.lower_head(index, 400).lstrip()
        if not _NATIVE_FRAME.match(frame):
            continue
        if "cudnn" in frame:
            return True
    return False


def _usage(log: LogText, line: int) -> tuple[int, int] | None:
    """(free, total) as TensorFlow and XLA print them right after a cuDNN handle failed
    ("Memory usage: N bytes free, M bytes total"); None when the log does not say."""
    for index in range(line, min(len(log.lines), line + 3)):
        usage = _MEMORY_USAGE.search(log.head(index, 400))
        if usage is not None:
            return int(usage.group(1)), int(usage.group(2))
    return None


def _mostly_free(usage: tuple[int, int] | None) -> bool:
    """Most of the device was free when the failure came: not for lack of memory."""
    return usage is not None and usage[1] > 0 and usage[0] >= MOSTLY_FREE * usage[1]


def _jax_handle_not_starved(
    log: LogText, line: int, hit: Hit, usage: tuple[int, int] | None
) -> bool:
    """A cuDNN handle that JAX could not create, on a device not shown nearly full. JAX keeps
    a quarter of the device out of its pool, and in its threads this failure is a jaxlib
    built for another CUDA or cuDNN far more often than memory."""
    if hit.info.framework != "jax" or "could not create cudnn handle" not in log.lower_head(line):
        return False
    return usage is None or usage[1] <= 0 or not little_free(usage[0], usage[1])


def _version_mismatch_before(log: LogText, line: int) -> bool:
    """The log names the other cause of a cuDNN start-up failure: the wrong library."""
    start = max(0, line - MISMATCH_LOOKBACK_LINES)
    return any(
        cue in log.lower_head(index, 2000)
        for index in range(start, line + 1)
        for cue in _CUDNN_MISMATCH
    )


def find_fallback(log: LogText) -> list[Hit]:
    """Any other "out of memory" said as an error: on a GPU if the line names one, else host."""
    hits: list[Hit] = []
    for line, column in log.anchors(_FALLBACK_NEEDLE):
        first = log.lines[line][max(0, column - 200) : column + 200]
        leading = strip_prefix(first).lower().startswith("out of memory")
        if not (leading or _ERRORISH.search(first)):
            continue
        window = log.window(line, column, max_lines=2)
        if ADVICE.search(" ".join(window.parts)[:2000]) or is_source_line(window.parts[0]):
            continue
        # The line, or the one above it (C++'s "terminate called after throwing an instance
        # of 'thrust::system::system_error'" above its what()).
        if GPU_WORDS_PATTERN.search(first) or GPU_WORDS_PATTERN.search(log.head(line - 1, 300)):
            library = _library_named(first.lower()) or "cuda"
            hits.append(replace(_hit(log, line, window, library, None, lookback=False), weak=True))
        else:
            hits.append(replace(_host_hit(log, line, window), weak=True))
    return hits


def _library_named(lowered: str) -> str | None:
    for word, library in _LIBRARY_WORDS:
        if word in lowered:
            return library
    return None


def _hit(
    log: LogText,
    line: int,
    window: Window,
    library: str | None,
    framework: str | None,
    *,
    lookback: bool = True,
    phase: str | None = None,
) -> Hit:
    text = window.joined
    requested = None
    for pattern in _REQUESTS:
        requested = to_int(first_group(pattern.search(text)))
        if requested is not None:
            break
    if requested is None:
        requested = to_bytes(first_group(_SIZED_REQUEST.search(text)))
    device = None
    for pattern in _DEVICE:
        device = to_int(first_group(window.search(pattern)))
        if device is not None:
            break
    named = framework_in(text[:4000].lower())
    info = OomInfo(
        framework=named or framework or (lookback and guess_framework(log, line)) or "unknown",
        kind=OomKind.DISGUISED,
        message=window.message(1),
        device=device,
        device_type="gpu",
        requested_bytes=requested,
        requested_unknown_huge=is_huge(requested),
        total_bytes=to_int(first_group(_TOTAL.search(text))),
        allocated_bytes=to_bytes(first_group(_ALLOCATED.search(text))),
        free_bytes=first_known(
            to_bytes(first_group(_AVAILABLE.search(text))),
            to_int(first_group(_PADDLE_CHUNK.search(text))),
        ),
        limit_bytes=next(
            (v for p in _LIMITS if (v := to_int(first_group(p.search(text)))) is not None), None
        ),
        library=library,
        phase=phase,
        rank=rank_of(log.lines[line][:200]),
    )
    key: tuple[object, ...] = (library, requested) if requested is not None else ()
    return Hit(line=line, end=window.last_line, info=info, rank=info.rank, key=key)


def _host_hit(log: LogText, line: int, window: Window) -> Hit:
    requested = to_int(first_group(_REQUESTS[-1].search(window.parts[0])))
    info = OomInfo(
        framework="host",
        kind=OomKind.HOST_ALLOC,
        message=window.message(1),
        device_type="cpu",
        requested_bytes=requested,
        requested_unknown_huge=is_huge(requested),
        rank=rank_of(log.lines[line][:200]),
    )
    return Hit(line=line, end=line, info=info, rank=info.rank)
