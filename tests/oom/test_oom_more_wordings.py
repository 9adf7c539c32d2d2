"""Memory errors in wordings met in real threads: TensorRT, OpenVINO, vLLM's KV cache, a job
runner's exit status, numpy's error class named in a sentence, and XLA's peak-buffer listing or
rematerialization warning pasted without its error line."""

from __future__ import annotations

import pytest

from memdoc.oom import parse_all, parse_text
from memdoc.rules.confidence import confidence_word
from memdoc.rules.engine import explain_text

_KV_CACHE_SHORT = (
    "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens "
    "that can be stored in KV cache (3664). Try increasing gpu_memory_utilization or "
    "decreasing max_model_len when initializing the engine."
)
_KV_CACHE_EMPTY = (
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine."
)
_REMAT = (
    "2024-02-19 15:14:56.882326: W external/xla/xla/service/hlo_rematerialization.cc:2941] "
    "Can't reduce memory use below -30.29GiB (-32529110990 bytes) by rematerialization; only "
    "reduced to 49.62GiB (53280000080 bytes), down from 49.62GiB (53280000080 bytes) originally"
)
_LISTING = (
    "Buffer 2:\n"
    "\tSize: 34.57GiB\n"
    '\tOperator: op_name="jit(xsmatrix)/jit(main)/transpose[permutation=(1, 0, 2, 3)]" '
    'source_file="spec/modit.py" source_line=37\n'
    "\tXLA Label: fusion\n"
    "\tShape: f64[40,11,100,105456]\n"
    "\t==========================\n"
)


@pytest.mark.parametrize(
    ("text", "kind", "library"),
    [
        pytest.param(
            "[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: "
            "OutOfMemory (no further information)",
            "disguised",
            "trt",
            id="tensorrt",
        ),
        pytest.param(
            "[GPU] Exceeded max size of memory object allocation: requested 8589934592 bytes, but "
            "max alloc size supported by device is 4294959104 bytes.",
            "disguised",
            "opencl",
            id="openvino-gpu",
        ),
        pytest.param(
            "[model:train] Training task exit with status code 137", "host-kill", None, id="137"
        ),
        pytest.param("CUDA outof memory on validation loop.", "disguised", "cuda", id="outof"),
        pytest.param(
            "ManagedCuda.NPP.NPPException: Device allocation error", "disguised", "cuda", id="npp"
        ),
        pytest.param(_KV_CACHE_SHORT, "disguised", "vllm", id="vllm-kv-cache-short"),
        pytest.param(_KV_CACHE_EMPTY, "disguised", "vllm", id="vllm-no-kv-cache"),
        pytest.param(
            "ValueError: To serve at least one request with the models's max seq len (32768), "
            "(4.0 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(2.1 GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            "when initializing the engine.",
            "disguised",
            "vllm",
            id="vllm-v1-kv-cache",
        ),
        pytest.param(
            "Qwen-7B-Instruct Model numpy.core._exceptions._ArrayMemoryError:",
            "host-alloc",
            None,
            id="numpy-class-in-a-sentence",
        ),
        pytest.param(_REMAT, "compile", None, id="xla-remat-warning"),
        pytest.param(
            'level=error msg="runc create failed: unable to start container process: container '
            'init was OOM-killed (memory limit too low?)"',
            "host-kill",
            None,
            id="container-oom-killed",
        ),
        pytest.param(
            "slurmstepd: error: Job 123 exceeded memory limit (16777216 > 16384000), being killed",
            "host-kill",
            None,
            id="slurm-job-over-its-limit",
        ),
        pytest.param(
            "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=123.batch. Some of your "
            "processes may have been killed by the cgroup out-of-memory handler.",
            "host-kill",
            None,
            id="slurm-oom-kill-event",
        ),
        pytest.param(
            "The node was low on resource: memory. Container trainer was using 30Gi, which "
            "exceeds its request of 16Gi.",
            "host-kill",
            None,
            id="kubernetes-eviction",
        ),
        pytest.param(
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on "
            "memory.",
            "host-kill",
            None,
            id="ray-memory-monitor",
        ),
        pytest.param(
            "distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarting",
            "host-kill",
            None,
            id="dask-nanny",
        ),
        pytest.param(
            "ClientError: Please use an instance type with more memory, or reduce the size of "
            "job data processed on an instance.",
            "host-kill",
            None,
            id="sagemaker",
        ),
        pytest.param(
            "OSError: [WinError 1455] The paging file is too small for this operation to "
            'complete. Error loading "torch\\lib\\cudnn_cnn_infer64_8.dll"',
            "host-alloc",
            None,
            id="windows-paging-file",
        ),
        pytest.param(
            "Fatal Python error: Cannot recover from MemoryErrors while normalizing exceptions.",
            "host-alloc",
            None,
            id="python-memory-errors",
        ),
        pytest.param(
            "Error: model requires more system memory (5.8 GiB) than is available (3.2 GiB)",
            "host-alloc",
            None,
            id="ollama",
        ),
        pytest.param(
            "llama_model_load: error loading model: unable to allocate backend buffer",
            "disguised",
            "cuda",
            id="ggml-backend-buffer",
        ),
        pytest.param(
            "ValueError: Some modules are dispatched on the CPU or the disk. Make sure you have "
            "enough GPU RAM to fit the quantized model.",
            "disguised",
            "cuda",
            id="transformers-quantized-dispatch",
        ),
        pytest.param(
            "RuntimeError: Unable to find a valid cuDNN algorithm to run convolution",
            "disguised",
            "cudnn",
            id="pytorch-no-cudnn-algorithm",
        ),
        pytest.param(
            "4.77 GiB allowed; 4.74 GiB reserved in total by PyTorch",
            "allocator",
            None,
            id="pytorch-message-tail-alone",
        ),
        pytest.param(
            "Of the allocated memory 3.00 GiB is allocated by PyTorch, and 97.51 MiB is reserved "
            "by PyTorch but unallocated.",
            "allocator",
            None,
            id="pytorch-2-message-tail-alone",
        ),
        pytest.param(
            "    Tried to allocate 136.00 MiB. GPU 0 has a total capacity of 22.36 GiB of\n"
            "    which 120.88 MiB is free. ...",
            "allocator",
            None,
            id="pytorch-2-message-without-its-first-words",
        ),
        pytest.param(
            "c++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.",
            "host-kill",
            None,
            id="gcc-killed-building-an-extension",
        ),
        pytest.param(
            "nvcc error   : 'cicc' died due to signal 9 (Kill signal)",
            "host-kill",
            None,
            id="nvcc-killed-building-an-extension",
        ),
        pytest.param(
            "!!! Exception during processing !!! Allocation on device",
            "allocator",
            None,
            id="comfyui",
        ),
        pytest.param(
            "DataLoader worker (pid xxx) is killed by signal",
            "dataloader-killed",
            None,
            id="worker-killed-by-an-unnamed-signal",
        ),
    ],
)
def test_a_memory_error_in_another_wording_is_recognised(
    text: str, kind: str, library: str | None
) -> None:
    oom = parse_text(text)

    assert oom is not None
    assert (oom.kind, oom.library) == (kind, library)


def test_a_library_oom_without_its_own_rule_is_read_like_the_frameworks() -> None:
    text = "[TRT] [E] 2: [virtualMemoryBuffer.cpp] Error Code 2: OutOfMemory (no further info)"

    assert explain_text(text).findings  # the commonest causes, said to be a guess


@pytest.mark.parametrize(
    ("text", "ranked"),
    [
        pytest.param(
            _KV_CACHE_SHORT,
            ["activations-too-large", "memory-fraction-cap", "model-too-large"],
            id="a-context-too-long-for-the-cache",
        ),
        pytest.param(
            _KV_CACHE_EMPTY,
            ["model-too-large", "memory-fraction-cap", "activations-too-large"],
            id="no-cache-at-all",
        ),
    ],
)
def test_vllms_kv_cache_names_its_three_settings_most_likely_first(
    text: str, ranked: list[str]
) -> None:
    findings = explain_text(text).findings

    assert [f.rule for f in findings] == ranked
    fixes = " ".join(fix.code for f in findings for fix in f.fixes)
    assert "--max-model-len" in fixes and "--gpu-memory-utilization" in fixes
    assert "--quantization" in fixes


@pytest.mark.parametrize(
    ("text", "first", "word"),
    [
        pytest.param(
            "slurmstepd: error: Job 123 exceeded memory limit (16777216 > 16384000), being killed",
            "host-oom",
            "strong",
            id="a-scheduler-says-memory",
        ),
        pytest.param(
            "llama_model_load: error loading model: unable to allocate backend buffer",
            "model-too-large",
            "possible",
            id="weights-that-found-no-room",
        ),
    ],
)
def test_platform_and_loader_notices_name_their_cause(text: str, first: str, word: str) -> None:
    finding = explain_text(text).findings[0]

    assert (finding.rule, confidence_word(finding.confidence)) == (first, word)


def test_theanos_memory_error_for_device_memory_is_a_device_error() -> None:
    oom = parse_text(
        "MemoryError: Error allocating 1073741824 bytes of device memory (out of memory).\n"
        "Apply node that caused the error: GpuElemwise"
    )

    assert oom is not None and oom.device_type == "gpu" and oom.kind != "host-alloc"


def test_slurm_gives_the_jobs_limit() -> None:
    oom = parse_text(
        "slurmstepd: error: Job 123 exceeded memory limit (16777216 > 16384000), being killed"
    )

    assert oom is not None and oom.limit_bytes == 16384000 * 1024


def test_vllm_reports_the_context_asked_for_and_what_the_cache_holds() -> None:
    evidence = [e.text for e in explain_text(_KV_CACHE_SHORT).findings[0].evidence]

    assert evidence == ["max_model_len asked for: 4096", "tokens the KV cache could hold: 3664"]
    # The shorter context offered is one the cache holds.
    (fix,) = explain_text(_KV_CACHE_SHORT).findings[0].fixes
    assert "--max-model-len 3584" in fix.code


def test_xlas_rematerialization_warning_alone_is_read_as_a_plan_that_does_not_fit() -> None:
    result = explain_text(_REMAT)

    assert result.oom is not None and result.oom.xla_total_bytes == 53280000080
    assert result.findings[0].rule == "xla-temp-buffers"


def test_openvino_reports_the_devices_largest_allocation_as_the_limit() -> None:
    text = (
        "[GPU] Exceeded max size of memory object allocation: requested 8589934592 bytes, but "
        "max alloc size supported by device is 4294959104 bytes."
    )

    oom = parse_text(text)

    assert oom is not None
    assert (oom.requested_bytes, oom.limit_bytes) == (8589934592, 4294959104)


def test_xlas_peak_buffer_listing_alone_is_read_as_its_oom() -> None:
    oom = parse_text(_LISTING)

    assert oom is not None
    assert oom.xla_buffers and abs(oom.xla_buffers[0][1] - 34.57 * 2**30) < 2**20
    assert oom.shape == (40, 11, 100, 105456)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("XLA Label: fusion\nShape: f32[8,128]\n", id="a-label-without-a-size"),
        pytest.param(
            "INFO 05-01 10:00:00 gpu_executor.py:83] # GPU blocks: 2048, # CPU blocks: 512\n"
            "INFO 05-01 10:00:01 kv_cache_utils.py:634] GPU KV cache size: 51,888 tokens",
            id="vllm-sizing-its-cache",
        ),
        pytest.param("The pod was not OOM-killed: it hit its deadline", id="not-oom-killed"),
        pytest.param(
            "In the message, 'reserved in total by PyTorch' is the size of the pool.",
            id="the-tail-words-without-a-figure",
        ),
        pytest.param(
            "Each GPU has a total capacity of memory that the scheduler shares.",
            id="capacity-in-prose",
        ),
        pytest.param(
            "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: "
            "98304, Hardware limit: 65536. Reducing block sizes or `num_stages` may help.",
            id="a-kernels-shared-memory-limit",
        ),
        pytest.param(
            "nvcc error   : 'cicc' died due to signal 11 (Invalid memory reference)",
            id="a-compiler-that-crashed",
        ),
        pytest.param(
            "torch.OutOfMemoryError is raised when the allocator gives up",
            id="the-class-named-in-a-sentence",
        ),
        pytest.param(
            "slurmstepd: error: *** JOB 123 CANCELLED DUE TO TIME LIMIT ***\n"
            "the job had not exceeded memory limit",
            id="slurm-time-limit",
        ),
        pytest.param(
            '    raise ValueError("Make sure you have enough GPU RAM to fit the quantized model")',
            id="the-message-quoted-in-source",
        ),
        pytest.param(
            "the DataLoader worker (pid 7) is killed by signal handlers we install in tests",
            id="worker-signal-words-in-prose",
        ),
        pytest.param(
            "Why can't XLA reduce memory use below the limit by rematerialization here?",
            id="remat-asked-about",
        ),
        pytest.param(
            "np.empty raised numpy.core._exceptions._ArrayMemoryError in the old code path, "
            "fixed in 1.2",
            id="a-changelog-line",
        ),
        pytest.param("process finished with exit status code 0", id="status-code-0"),
        pytest.param(
            "RuntimeError: DataLoader worker (pid 237557) is killed by signal: Segmentation fault.",
            id="a-worker-that-crashed",
        ),
        pytest.param(
            "E cuda_dnn.cc:534] Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR\n"
            "E cuda_dnn.cc:538] Memory usage: 7973961728 bytes free, 8198619136 bytes total.",
            id="cudnn-handle-with-the-device-mostly-free",
        ),
    ],
)
def test_near_misses_of_those_wordings_are_not_memory_errors(text: str) -> None:
    assert parse_all(text) == []
