"""Allocator settings read from the environment: PyTorch, TensorFlow and JAX, as event data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MIB = 1 << 20

# PyTorch reads PYTORCH_ALLOC_CONF first; PYTORCH_CUDA_ALLOC_CONF is its older, deprecated name.
TORCH_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
# XLA_CLIENT_MEM_FRACTION replaced XLA_PYTHON_CLIENT_MEM_FRACTION; jaxlib refuses both at once.
JAX_FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
JAX_DEFAULT_MEM_FRACTION = 0.75

_TORCH_BOOL_KEYS = {
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_background_threads",
}


def parse_bool(text: str | None) -> bool | None:
    """`True`/`false`/`1`/`0` as the frameworks spell them; None when unset or not a boolean."""
    if text is None:
        return None
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    return None


def split_torch_conf(text: str) -> list[tuple[str, str]]:
    """`a:1,b:[2:3,4:5]` -> [("a", "1"), ("b", "[2:3,4:5]")]: commas inside brackets stay."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    pairs: list[tuple[str, str]] = []
    for part in parts:
        key, sep, value = part.partition(":")
        if key.strip():
            pairs.append((key.strip(), value.strip() if sep else ""))
    return pairs


def torch_alloc_conf(environ: Mapping[str, str]) -> dict[str, Any]:
    """PyTorch's caching-allocator settings, as `allocator_config` event data.

    Only what the variable sets is reported (plus `backend`, whose default is `native`);
    parts PyTorch would reject are listed under `invalid` rather than guessed.
    """
    name = next((var for var in TORCH_CONF_VARS if environ.get(var)), None)
    conf: dict[str, Any] = {"framework": "pytorch", "backend": "native"}
    if name is None:
        return conf
    conf["env"] = {name: environ[name]}
    invalid: list[str] = []
    other: dict[str, str] = {}
    for key, value in split_torch_conf(environ[name]):
        if not _apply_torch_key(conf, key, value):
            if key in _KNOWN_TORCH_KEYS:
                invalid.append(f"{key}:{value}")
            else:
                other[key] = value
    if other:
        conf["other"] = other
    if invalid:
        conf["invalid"] = invalid
    return conf


_KNOWN_TORCH_KEYS = {
    "backend",
    "max_split_size_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "per_process_memory_fraction",
    *_TORCH_BOOL_KEYS,
}


def _apply_torch_key(conf: dict[str, Any], key: str, value: str) -> bool:
    """Store one recognised key; False when the key is unknown or its value is malformed."""
    if key == "backend":
        if value not in ("native", "cudaMallocAsync"):
            return False
        conf["backend"] = value
    elif key in _TORCH_BOOL_KEYS:
        flag = parse_bool(value)
        if flag is None:
            return False
        conf[key] = flag
    elif key == "max_split_size_mb":
        size_mb = _to_float(value)
        if size_mb is None or size_mb <= 0:
            return False
        conf["max_split_size_bytes"] = int(size_mb * MIB)
    elif key in ("garbage_collection_threshold", "per_process_memory_fraction"):
        fraction = _to_float(value)
        if fraction is None or not 0.0 < fraction <= 1.0:
            return False
        conf["memory_fraction" if key == "per_process_memory_fraction" else key] = fraction
    elif key == "roundup_power2_divisions":
        divisions = _roundup_divisions(value)
        if divisions is None:
            return False
        conf[key] = divisions
    else:
        return False
    return True


def _roundup_divisions(value: str) -> int | dict[str, int] | None:
    """`4`, or `[256:1,512:2,>:8]` (divisions per allocation size in MB) as a dict."""
    if not value.startswith("["):
        number = _to_float(value)
        return int(number) if number is not None and number == int(number) else None
    if not value.endswith("]"):
        return None
    table: dict[str, int] = {}
    for entry in value[1:-1].split(","):
        size, _, divisions = entry.partition(":")
        count = _to_float(divisions)
        if not size.strip() or count is None:
            return None
        table[size.strip()] = int(count)
    return table


def tf_alloc_conf(environ: Mapping[str, str]) -> dict[str, Any]:
    """TensorFlow's allocator switches: GPU memory growth and allocator, CPU BFC and limit."""
    conf: dict[str, Any] = {"framework": "tensorflow"}
    growth = parse_bool(environ.get("TF_FORCE_GPU_ALLOW_GROWTH"))
    if growth is not None:
        conf["allow_growth"] = growth
    gpu_allocator = environ.get("TF_GPU_ALLOCATOR", "").strip()
    conf["gpu_allocator"] = gpu_allocator or "bfc"
    conf["backend"] = "cudaMallocAsync" if gpu_allocator == "cuda_malloc_async" else "bfc"
    if tf_cpu_bfc_enabled(environ):
        conf["cpu_allocator"] = "bfc"
        limit = tf_cpu_bfc_limit_bytes(environ)
        if limit is not None:
            conf["cpu_memory_limit_bytes"] = limit
    env = {k: environ[k] for k in _TF_VARS if k in environ}
    if env:
        conf["env"] = env
    return conf


_TF_VARS = (
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "TF_GPU_ALLOCATOR",
    "TF_CPU_ALLOCATOR_USE_BFC",
    "TF_CPU_BFC_MEM_LIMIT_IN_MB",
)


def tf_cpu_bfc_enabled(environ: Mapping[str, str]) -> bool:
    """True when TensorFlow's CPU allocator is the BFC allocator, whose statistics are real
    (with the default CPU allocator `get_memory_info("CPU:0")` answers zeros)."""
    return parse_bool(environ.get("TF_CPU_ALLOCATOR_USE_BFC")) is True


def tf_cpu_bfc_limit_bytes(environ: Mapping[str, str]) -> int | None:
    size_mb = _to_float(environ.get("TF_CPU_BFC_MEM_LIMIT_IN_MB"))
    return int(size_mb * MIB) if size_mb is not None and size_mb > 0 else None


def jax_alloc_conf(environ: Mapping[str, str]) -> dict[str, Any]:
    """XLA client settings as the GPU client will apply them (defaults filled in: on a GPU,
    JAX pre-allocates 75% of the device unless told otherwise)."""
    conf: dict[str, Any] = {"framework": "jax"}
    preallocate = environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "")
    # jaxlib treats every value except false/False/0 as "on".
    conf["preallocate"] = preallocate not in ("false", "False", "0")
    fraction_var = next((var for var in JAX_FRACTION_VARS if environ.get(var)), None)
    fraction = _to_float(environ.get(fraction_var)) if fraction_var else None
    conf["mem_fraction"] = fraction if fraction is not None else JAX_DEFAULT_MEM_FRACTION
    allocator = environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").strip().lower()
    conf["gpu_allocator"] = allocator
    conf["backend"] = {
        "default": "bfc",
        "platform": "platform",
        "cuda_async": "cudaMallocAsync",
    }.get(allocator, allocator)
    env = {k: environ[k] for k in _JAX_VARS if k in environ}
    if env:
        conf["env"] = env
    return conf


_JAX_VARS = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "JAX_PLATFORMS",
)


def _to_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None
