"""OOMs that do not say OOM (cuDNN, cuBLAS, NCCL, driver) and host memory failures."""

from __future__ import annotations

from typing import Any

import pytest
from oomtext import CATALOGUE, FORMATS, fenced, phrase, quoted

from memdoc.oom import parse_all, parse_text
from memdoc.trace.model import ProcessUsage


def assert_fields(text: str, expected: dict[str, Any]) -> None:
    info = parse_text(text)
    assert info is not None, text
    for name, value in expected.items():
        assert getattr(info, name) == value, (name, getattr(info, name), value)


def disguised(library: str | None, framework: str) -> dict[str, Any]:
    return {"kind": "disguised", "library": library, "framework": framework}


DISGUISED = [
    pytest.param(
        fenced(CATALOGUE, "## 2.", 0), disguised("cuda", "pytorch"), id="cuda-error-out-of-memory"
    ),
    pytest.param(
        fenced(CATALOGUE, "## 2.", 1),
        {**disguised("cuda", "pytorch"), "line": 3},
        id="cuda-error-in-ddp-barrier",
    ),
    pytest.param(
        fenced(CATALOGUE, "## 2.", 2), disguised("cuda", "pytorch"), id="cuda-error-async-note"
    ),
    pytest.param(
        quoted(FORMATS, "CUBLAS_STATUS_ALLOC_FAILED when calling"),
        disguised("cublas", "pytorch"),
        id="cublas-alloc-failed-pytorch",
    ),
    pytest.param(
        quoted(CATALOGUE, "CUDNN_STATUS_ALLOC_FAILED"),
        disguised("cudnn", "unknown"),
        id="cudnn-alloc-failed-lua-torch",
    ),
    pytest.param(
        quoted(CATALOGUE, "Create cublas handle failed"),
        disguised("cublas", "unknown"),
        id="mxnet-cublas-handle",
    ),
    pytest.param(
        quoted(CATALOGUE, "CUDA: out of memory"), disguised("cuda", "unknown"), id="mxnet-cuda"
    ),
    pytest.param(quoted(CATALOGUE, "[TRT]"), disguised("trt", "unknown"), id="tensorrt-allocator"),
    pytest.param(
        quoted(FORMATS, "NVML_SUCCESS == r INTERNAL ASSERT FAILED"),
        disguised("nvml", "pytorch"),
        id="nvml-assert-in-caching-allocator",
    ),
    pytest.param(
        quoted(FORMATS, "nvmlInit_v2_"), disguised("nvml", "pytorch"), id="nvml-init-assert"
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5e", 0),
        {**disguised("cuda", "tensorflow"), "requested_bytes": 199557120},
        id="tf-driver-failed-to-allocate",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5e", 1),
        {**disguised("cuda", "tensorflow"), "requested_bytes": 33554432},
        id="tf-driver-failed-to-allocate-out-of-memory",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5e", 2),
        {**disguised("cuda", "tensorflow"), "device": 0, "total_bytes": 11523260416},
        id="tf-context-creation",
    ),
    pytest.param(
        quoted(CATALOGUE, "18446744073709551615"),
        {**disguised("cuda", "unknown"), "total_bytes": 2**64 - 1},
        id="context-creation-total-2-to-the-64",
    ),
    pytest.param(
        quoted(CATALOGUE, "unified memory"),
        {**disguised("cuda", "unknown"), "requested_bytes": 14555565056},
        id="xla-unified-memory",
    ),
    pytest.param(
        quoted(CATALOGUE, "Could not create cudnn handle"),
        disguised("cudnn", "tensorflow"),
        id="tf-cudnn-handle",
    ),
    pytest.param(
        quoted(CATALOGUE, "Failed to get convolution algorithm"),
        disguised("cudnn", "tensorflow"),
        id="tf-convolution-algorithm",
    ),
    pytest.param(
        quoted(CATALOGUE, "failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED"),
        disguised("cublas", "tensorflow"),
        id="tf-cublas-not-initialized",
    ),
    pytest.param(
        quoted(CATALOGUE, "cuda_blas.cc:372"),
        disguised("cublas", "tensorflow"),
        id="tf-cublas-alloc-failed",
    ),
    pytest.param(
        quoted(CATALOGUE, "Dst tensor is not initialized"),
        disguised(None, "tensorflow"),
        id="tf-dst-tensor",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 5h", 0),
        {
            **disguised("cudnn", "tensorflow"),
            "requested_bytes": 4718624784,
            "limit_bytes": 4294967296,
            "phase": "eval",  # [Op:__inference_predict_function_1150]
        },
        id="tf-cudnn-autotune-above-workspace-limit",
    ),
    pytest.param(
        quoted(CATALOGUE, "nccl_archive"),
        {**disguised("nccl", "unknown"), "device": 6},
        id="nccl-inside-tf",
    ),
    pytest.param(
        quoted(CATALOGUE, "Failed to determine best cudnn convolution algorithm"),
        disguised("cudnn", "jax"),
        id="jax-cudnn-algorithm",
    ),
    pytest.param(
        quoted(CATALOGUE, "DNN library is not found"), disguised("cudnn", "jax"), id="jax-no-dnn"
    ),
    pytest.param(
        quoted(CATALOGUE, "DNN library initialization failed"),
        disguised("cudnn", "jax"),
        id="jax-dnn-init",
    ),
    pytest.param(
        quoted(CATALOGUE, "cudaErrorMemoryAllocation"),
        disguised("cuda", "unknown"),
        id="cuda-error-memory-allocation",
    ),
    pytest.param(
        phrase(CATALOGUE, "`CUBLAS_STATUS_NOT_INITIALIZED` (TF").strip("`").split("`")[0],
        disguised("cublas", "unknown"),
        id="cublas-not-initialized-bare",
    ),
    pytest.param(fenced(CATALOGUE, "## 7.", 0), disguised("nccl", "unknown"), id="nccl-warn"),
    pytest.param(
        fenced(CATALOGUE, "## 7.", 1),
        {**disguised("nccl", "unknown"), "device": 3, "requested_bytes": 6291456, "line": 1},
        id="nccl-warn-and-calloc-are-one-error",
    ),
    pytest.param(
        fenced(CATALOGUE, "## 7.", 2), {**disguised("nccl", "unknown"), "device": 0}, id="nccl-enq"
    ),
    pytest.param(
        "2017-10-31 09:07:12.584335: E tensorflow/stream_executor/cuda/cuda_dnn.cc:371] "
        "could not create cudnn handle: CUDNN_STATUS_NOT_INITIALIZED",
        disguised("cudnn", "tensorflow"),
        id="tf-cudnn-handle-not-initialized",
    ),
]


@pytest.mark.parametrize(("text", "expected"), DISGUISED)
def test_disguised_oom_is_recognised(text: str, expected: dict[str, Any]) -> None:
    assert_fields(text, expected)


HOST = [
    pytest.param(
        fenced(CATALOGUE, "### 4a", 0),
        {
            "framework": "pytorch",
            "kind": "dataloader-killed",
            "processes": (ProcessUsage(pid=19597, used_bytes=None),),
        },
        id="dataloader-worker-killed",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 4a", 1),
        {"framework": "pytorch", "kind": "shm"},
        id="dataloader-worker-bus-error",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 4a", 2),
        {"kind": "dataloader-killed"},
        id="dataloader-worker-terminated",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 4a", 3),
        {"kind": "dataloader-killed", "processes": ()},
        id="dataloader-exited-unexpectedly-source-line",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 4b", 0),
        {
            "framework": "host",
            "kind": "host-kill",
            # anon-rss + file-rss of the victim
            "processes": (ProcessUsage(pid=25635, used_bytes=(23902876 + 154436) * 1024),),
            "line": 1,
        },
        id="kernel-oom-killer",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 4b", 1),
        {"framework": "host", "kind": "host-kill", "phase": "load", "line": 2},
        id="shell-killed-while-loading-shards",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 4c", 0),
        {"framework": "host", "kind": "host-alloc", "requested_bytes": 4672512},
        id="opencv-insufficient-memory",
    ),
    pytest.param(
        fenced(CATALOGUE, "### 4c", 1),
        {"framework": "host", "kind": "host-alloc"},
        id="jit-session-enomem",
    ),
    # The forms below are standard wordings (bash, Python, torchrun, Docker, the kernel).
    pytest.param(
        "bash: line 1: 31337 Killed                  python train.py --bs 64",
        {"kind": "host-kill", "processes": (ProcessUsage(pid=31337, used_bytes=None),)},
        id="bash-killed-with-pid",
    ),
    pytest.param(
        "[1]+  Killed                  python train.py", {"kind": "host-kill"}, id="job-control"
    ),
    pytest.param(
        "Process finished with exit code 137 (interrupted by signal 9: SIGKILL)",
        {"kind": "host-kill"},
        id="exit-code-137",
    ),
    pytest.param(
        "subprocess.CalledProcessError: Command '['python', 'train.py']' died with"
        " <Signals.SIGKILL: 9>.",
        {"kind": "host-kill"},
        id="python-signals-sigkill",
    ),
    pytest.param(
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0"
        " (pid: 3264) of binary: /usr/bin/python3",
        {"kind": "host-kill", "processes": (ProcessUsage(pid=3264, used_bytes=None),)},
        id="torchrun-exitcode-minus-9",
    ),
    pytest.param(
        "    State:          Terminated\n      Reason:       OOMKilled\n      Exit Code:    137",
        {"kind": "host-kill"},
        id="kubernetes-oomkilled",
    ),
    pytest.param(
        "[12345.678901] Memory cgroup out of memory: Killed process 4242 (python) total-vm:"
        "9000000kB, anon-rss:8000000kB, file-rss:1000kB, shmem-rss:0kB, UID:0 pgtables:20000kB"
        " oom_score_adj:0",
        {
            "kind": "host-kill",
            "processes": (ProcessUsage(pid=4242, used_bytes=(8000000 + 1000) * 1024),),
        },
        id="cgroup-oom-kill",
    ),
    pytest.param(
        "Loading checkpoint shards:  50%|█████     | 1/2 [00:05<00:05,  5.11s/it]Killed",
        {"kind": "host-kill", "phase": "load"},
        id="killed-after-an-unfinished-progress-bar",
    ),
    pytest.param("Bus error (core dumped)", {"kind": "shm"}, id="bus-error"),
    pytest.param(
        "RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on"
        " device (28)",
        {"kind": "shm", "framework": "pytorch"},
        id="torch-shm-file-full",
    ),
    pytest.param(
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 11.2 GiB for an array with"
        " shape (1000, 1500000) and data type float64",
        {
            "kind": "host-alloc",
            "requested_bytes": round(11.2 * 1024**3),
            "shape": (1000, 1500000),
            "dtype": "float64",
        },
        id="numpy-memory-error",
    ),
    pytest.param("MemoryError", {"kind": "host-alloc"}, id="python-memory-error"),
    pytest.param(
        "terminate called after throwing an instance of 'std::bad_alloc'\n"
        "  what():  std::bad_alloc",
        {"kind": "host-alloc", "line": 1},
        id="cxx-bad-alloc",
    ),
    pytest.param(
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough"
        " memory: you tried to allocate 8589934592 bytes.",
        {"framework": "pytorch", "kind": "host-alloc", "requested_bytes": 8589934592},
        id="default-cpu-allocator-windows",
    ),
]


@pytest.mark.parametrize(("text", "expected"), HOST)
def test_host_memory_failure_is_recognised(text: str, expected: dict[str, Any]) -> None:
    assert_fields(text, expected)


def test_torchrun_failure_summary_is_one_kill_of_its_rank() -> None:
    text = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-01_12:00:00
  host      : node1
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 3264)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 3264
============================================================"""
    found = parse_all(text)
    assert len(found) == 1
    assert found[0].kind == "host-kill"
    assert found[0].rank == 3
    assert found[0].processes == (ProcessUsage(pid=3264, used_bytes=None),)


def test_dataloader_worker_killed_twice_in_a_traceback_chain_is_one_error() -> None:
    text = (
        fenced(CATALOGUE, "### 4a", 0)
        + "\n\nThe above exception was the direct cause of the following exception:\n\n"
        "RuntimeError: DataLoader worker (pid(s) 19597) exited unexpectedly"
    )
    assert len(parse_all(text)) == 1


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Killed the stale run before starting", id="prose-killed"),
        pytest.param("process exited with exit code 1", id="exit-code-1"),
        pytest.param("exitcode: -6 (pid: 12)", id="sigabrt"),
        pytest.param("You may run out of memory with batch size 512.", id="advice"),
        pytest.param(
            "RuntimeError: unable to open shared memory object </torch_1_2> in read-write mode:"
            " Too many open files (24)",
            id="shm-file-descriptors",
        ),
        pytest.param(
            'Traceback (most recent call last):\n  File "train.py", line 9, in step\n'
            '    if "CUDA out of memory" in str(e) or "CUBLAS_STATUS_ALLOC_FAILED" in str(e):\n'
            "ValueError: bad batch",
            id="source-line-that-quotes-oom-texts",
        ),
        pytest.param(
            'Traceback (most recent call last):\n  File "train.py", line 9, in step\n'
            "    except torch.cuda.OutOfMemoryError:\nKeyError: 'labels'",
            id="source-line-that-catches-the-oom-class",
        ),
        # Catalogued as a possible disguise ("format only"), but in the labelled corpus's real
        # threads a jaxlib built for another CUDA or cuDNN gave it every time.
        pytest.param(quoted(CATALOGUE, "dnn != nullptr"), id="jax-dnn-ret-check"),
    ],
)
def test_near_misses_are_not_memory_errors(text: str) -> None:
    assert parse_text(text) is None


@pytest.mark.parametrize(
    ("above", "memory"),
    [
        pytest.param("", True, id="alone"),
        pytest.param(
            "E tensorflow/stream_executor/cuda/cuda_dnn.cc:359] Loaded runtime CuDNN library: "
            "8.0.5 but source was compiled with: 8.1.0.  CuDNN library needs to have matching "
            "major version and equal or higher minor version.\n",
            False,
            id="after-a-version-mismatch",
        ),
        pytest.param(
            "W tensorflow/stream_executor/platform/default/dso_loader.cc:64] Could not load "
            "dynamic library 'libcudnn.so.8'; dlerror: libcudnn.so.8: cannot open shared object\n",
            False,
            id="after-a-missing-library",
        ),
    ],
)
def test_a_cudnn_start_up_failure_is_memory_unless_the_log_names_the_wrong_library(
    above: str, memory: bool
) -> None:
    text = above + (
        "UnknownError: Failed to get convolution algorithm. This is probably because cuDNN "
        "failed to initialize, so try looking to see if a warning log message was printed above."
    )

    assert (parse_text(text) is not None) is memory
