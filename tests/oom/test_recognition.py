"""Forms found on texts the project never saw: memory errors to recognise, and look-alikes."""

from __future__ import annotations

import pytest
from oomtext import CATALOGUE, fenced, quoted

from memdoc.oom import parse_text
from memdoc.rules.engine import explain_in_words, explain_text

ESC = "\x1b"
JUPYTER = (
    f"{ESC}[0;31m-------------------------------------------------------------------{ESC}[0m\n"
    f"{ESC}[0;31mOutOfMemoryError{ESC}[0m                 Traceback (most recent call last)\n"
    f"Cell {ESC}[0;32mIn[3], line 5{ESC}[0m\n"
    f"{ESC}[1;32m      3{ESC}[0m x {ESC}[38;5;241m={ESC}[39m torch.randn(8)\n"
    f"{ESC}[0;32m----> 5{ESC}[0m out {ESC}[38;5;241m={ESC}[39m model(x)\n\n"
    f"File {ESC}[0;32m/usr/lib/python3/dist-packages/torch/nn/modules/module.py:1518{ESC}[0m, in "
    f"{ESC}[0;36mModule._wrapped_call_impl{ESC}[0;34m(self, *args, **kwargs){ESC}[0m\n\n"
    f"{ESC}[0;31mOutOfMemoryError{ESC}[0m: CUDA out of memory. Tried to allocate 20.00 MiB "
    "(GPU 0; 14.75 GiB total capacity; 14.54 GiB already allocated; 4.81 MiB free; 14.58 GiB "
    "reserved in total by PyTorch)\n"
)
NCCL_SOCKET = (
    "node1:1234:1300 [0] misc/socket.cc:456 NCCL WARN socketStartConnect: Connect to "
    "10.0.0.2<40123> failed : Connection refused\n"
    "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL "
    "version 2.18.1\n"
)
NCCL_SYSTEM = (
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), "
    "NCCL version 2.14.3\nncclSystemError: System call (e.g. socket, malloc) or external "
    "library call failed or device error.\n"
)
NCCL_CUDA = (
    "RuntimeError: NCCL error in: /opt/pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
    "unhandled cuda error, NCCL version 2.7.8\nncclUnhandledCudaError: Call to CUDA function "
    "failed.\n"
)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(NCCL_SYSTEM, id="nccl-unhandled-system-error"),
        pytest.param(NCCL_CUDA, id="nccl-unhandled-cuda-error"),
        pytest.param(NCCL_SOCKET, id="nccl-socket-failure"),
        pytest.param(quoted(CATALOGUE, "unhandled system error"), id="catalogue-bare-nccl"),
        pytest.param(fenced(CATALOGUE, "## 7.", 3), id="nccl-tests-unhandled-cuda"),
    ],
)
def test_a_bare_nccl_failure_is_not_a_memory_error(text: str) -> None:
    assert parse_text(text) is None
    assert explain_text(text).findings == []


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED\n", id="bare"),
        pytest.param(
            '  File "/usr/lib/python3/dist-packages/torch/nn/modules/conv.py", line 456, in '
            "_conv_forward\n    return F.conv2d(input, weight, bias, self.stride,\n"
            "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED\n",
            id="in-a-convolution",
        ),
    ],
)
def test_pytorch_cudnn_not_initialized_is_a_broken_install_not_memory(text: str) -> None:
    # In PyTorch threads a cuDNN that does not match the build or the card gives it.
    assert parse_text(text) is None
    assert explain_text(text).findings == []


JAX_HANDLE = (
    "2023-02-15 05:44:23.038563: E external/xla/xla/stream_executor/cuda/cuda_dnn.cc:429] "
    "Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR\n"
)


@pytest.mark.parametrize(
    ("usage", "memory"),
    [
        pytest.param("", False, id="no-usage-line"),
        pytest.param(
            "700000000 bytes free, 4000000000 bytes total", False, id="jax-left-its-quarter"
        ),
        pytest.param("90000000 bytes free, 4000000000 bytes total", True, id="nearly-full"),
    ],
)
def test_a_cudnn_handle_jax_could_not_create_is_memory_only_on_a_nearly_full_device(
    usage: str, memory: bool
) -> None:
    # In JAX threads a jaxlib built for another CUDA or cuDNN gives this far more often.
    text = JAX_HANDLE + (
        f"2023-02-15 05:44:23.038600: E external/xla/xla/stream_executor/cuda/cuda_dnn.cc:433] "
        f"Memory usage: {usage}.\n"
        if usage
        else ""
    )

    found = parse_text(text)

    assert (found is not None) == memory
    if found is not None:
        assert (found.framework, found.library) == ("jax", "cudnn")


def test_a_cudnn_handle_tensorflow_could_not_create_is_still_memory() -> None:
    text = (
        "2019-05-02 10:00:00.000000: E tensorflow/stream_executor/cuda/cuda_dnn.cc:334] "
        "Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR\n"
    )

    found = parse_text(text)

    assert found is not None and (found.framework, found.library) == ("tensorflow", "cudnn")


def test_an_nccl_failure_that_says_memory_still_is_one() -> None:
    text = "node1:1:2 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'\n" + NCCL_CUDA

    found = parse_text(text)

    assert found is not None and found.library == "nccl"


@pytest.mark.parametrize(
    ("text", "framework", "kind", "requested_bytes"),
    [
        pytest.param(
            "Traceback (most recent call last):\n"
            '  File "train.py", line 88, in <module>\n    state = update(state, batch)\n'
            "RuntimeError: Resource exhausted: Out of memory while trying to allocate "
            "8589934592 bytes.\n",
            "jax",
            "allocator",
            8589934592,
            id="xla-older-resource-exhausted",
        ),
        pytest.param(
            "terminate called after throwing an instance of 'thrust::system::detail::bad_alloc'\n"
            "  what():  std::bad_alloc: cudaErrorMemoryAllocation: out of memory\n",
            "unknown",
            "disguised",
            None,
            id="cuda-error-memory-allocation",
        ),
        pytest.param(JUPYTER, "pytorch", "allocator", 20 * 2**20, id="jupyter-ansi-traceback"),
        pytest.param(
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
            "`cublasCreate(handle)`\n",
            "pytorch",
            "disguised",
            None,
            id="cublas-alloc-failed",
        ),
        pytest.param(
            "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling "
            "`cublasCreate(handle)`\n",
            "pytorch",
            "disguised",
            None,
            id="cublas-not-initialized",
        ),
        pytest.param(
            "E tensorflow/stream_executor/cuda/cuda_blas.cc:226] failed to create cublas handle: "
            "CUBLAS_STATUS_NOT_INITIALIZED\n",
            "tensorflow",
            "disguised",
            None,
            id="cublas-handle",
        ),
        pytest.param(
            "Loading checkpoint shards:  33%|###3      | 1/3 [00:21<00:42, 21.22s/it]Killed\n",
            "host",
            "host-kill",
            None,
            id="killed-loading-shards",
        ),
        pytest.param(
            "luajit: $ Torch: not enough memory: you tried to allocate 3GB. Buy new RAM! at "
            "/tmp/luarocks/torch7/lib/TH/THGeneral.c:246\n",
            "host",
            "host-alloc",
            3 * 2**30,
            id="torch7-not-enough-memory",
        ),
        pytest.param(
            "RuntimeError: $ Torch: not enough memory: you tried to allocate 0GB. Buy new RAM! "
            "at /pytorch/aten/src/TH/THGeneral.cpp:201\n",
            "host",
            "host-alloc",
            None,  # under one GiB: the size is not known
            id="pytorch-cpu-not-enough-memory-under-a-gib",
        ),
        pytest.param(
            "[2024-01-08 10:00:00,000] [ERROR] [launch.py:321:sigkill_handler] "
            "['/usr/bin/python3', '-u', 'train.py'] exits with return code = -9\n",
            "host",
            "host-kill",
            None,
            id="deepspeed-launcher-sigkill",
        ),
        pytest.param(
            "MemoryError: std::bad_alloc: out_of_memory: RMM failure at:/opt/conda/include/rmm/mr/"
            "device/pool_memory_resource.hpp:196: Maximum pool size exceeded\n",
            "unknown",
            "disguised",
            None,
            id="rapids-rmm-pool-maximum",
        ),
        pytest.param(
            "paddle.fluid.core_avx.EnforceNotMet: \n\nOut of memory error on GPU 0. Cannot "
            "allocate 2.000000GB memory on GPU 0, 14.500000GB memory has been allocated and "
            "available memory is only 256.000000MB.\n",
            "unknown",
            "disguised",
            2 * 2**30,
            id="paddle-out-of-memory-error-on-gpu",
        ),
        pytest.param(
            "0: EnforceNotMet: enforce allocating < available failed, 11000000000 >= 10500000000\n"
            "0:  at [/paddle/paddle/platform/gpu_info.cc:90]\n",
            "unknown",
            "disguised",
            11000000000,
            id="paddle-first-chunk",
        ),
        pytest.param(
            "F0102 10:00:00.000000  4242 gpu_memory.hpp:77] Check failed: try_reserve(size)\n"
            "*** Check failure stack trace: ***\n",
            "unknown",
            "disguised",
            None,
            id="nvcaffe-pool-reserve",
        ),
        pytest.param(
            "2019-01-01 10:00:00.000000: E tensorflow/stream_executor/cuda/cuda_driver.cc:806] "
            "failed to allocate 3.9",  # the thread cut the line here
            "tensorflow",
            "disguised",
            None,
            id="tf-driver-line-cut-short",
        ),
    ],
)
def test_memory_errors_in_forms_seen_in_the_wild_are_recognised(
    text: str, framework: str, kind: str, requested_bytes: int | None
) -> None:
    found = parse_text(text)

    assert found is not None
    assert (found.framework, found.kind, found.requested_bytes) == (
        framework,
        kind,
        requested_bytes,
    )


def test_tf1_device_note_on_one_line_gives_the_device_and_its_free_memory() -> None:
    text = (
        "name: Tesla P100-PCIE-16GB major: 6 minor: 0 memoryClockRate(GHz): 1.3285\n"
        "pciBusID: 0000:02:00.0\ntotalMemory: 15.90GiB freeMemory: 3.12GiB\n"
        "2019-01-01 10:00:05.000000: E tensorflow/stream_executor/cuda/cuda_driver.cc:806] "
        "failed to allocate 7.63G (8193048576 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY\n"
    )

    found = parse_text(text)

    assert found is not None and found.requested_bytes == 8193048576
    assert (found.total_bytes, found.free_bytes) == (round(15.90 * 2**30), round(3.12 * 2**30))


def test_an_absurd_size_from_macos_malloc_is_read_as_the_request() -> None:
    text = (
        "python(1234,0x7fff7bee6300) malloc: *** mach_vm_map(size=7037526865735659520) failed "
        "(error code=3)\n*** error: can't allocate region\n"
        "*** set a breakpoint in malloc_error_break to debug\nError: std::bad_alloc\n"
    )

    result = explain_text(text)

    assert result.oom is not None and result.oom.requested_unknown_huge
    assert result.findings[0].rule == "single-allocation-too-large"
    assert "size computation went wrong" in result.findings[0].summary


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "MemoryError: std::bad_alloc: CUDA error at: /opt/conda/include/rmm/mr/device/"
            "cuda_memory_resource.hpp:60: cudaErrorIllegalAddress an illegal memory access was "
            "encountered\n",
            id="rmm-wraps-an-illegal-address",
        ),
        pytest.param(
            "terminate called after throwing an instance of 'thrust::system::system_error'\n"
            "  what():  parallel_for failed: cudaErrorIllegalAddress: an illegal memory access "
            "was encountered\n",
            id="thrust-illegal-address",
        ),
    ],
)
def test_an_illegal_memory_access_is_a_fault_whatever_wraps_it(text: str) -> None:
    assert parse_text(text) is None
    assert explain_text(text).findings == []


def test_killed_while_loading_checkpoint_shards_is_a_host_oom_at_load() -> None:
    text = "Loading checkpoint shards:  33%|###3      | 1/3 [00:21<00:42, 21.22s/it]Killed\n"

    result = explain_text(text)

    assert result.oom is not None and result.oom.phase == "load"
    assert [f.rule for f in result.findings][:1] == ["host-oom"]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: failed initializing StreamExecutor "
            "for CUDA device ordinal 0: INTERNAL: failed call to cuDevicePrimaryCtxRetain: "
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory; total memory reported: 25393692672\n",
            id="jax-primary-context",
        ),
        pytest.param(
            'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
            "    torch.zeros(1).cuda()\nRuntimeError: CUDA driver error: out of memory\n",
            id="torch-driver-at-init",
        ),
        pytest.param(
            "E tensorflow/stream_executor/cuda/cuda_driver.cc:271] failed call to cuInit: "
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory\n",
            id="tf-cuinit",
        ),
        pytest.param(
            '  File "train.py", line 79, in load_model\n'
            "    model = Tacotron2(hparams).cuda()\n"
            "RuntimeError: cuda runtime error (2) : out of memory at "
            "/pytorch/aten/src/THC/THCTensorRandom.cu:25\n",
            id="torch-0.4-random-generators-at-start",
        ),
        pytest.param(
            '  File "site-packages/torch/cuda/__init__.py", line 293, in _lazy_init\n'
            "    torch._C._cuda_init()\nRuntimeError: CUDA error: out of memory\n",
            id="torch-lazy-init",
        ),
    ],
)
def test_no_memory_for_a_context_means_another_process_held_it(text: str) -> None:
    result = explain_text(text)

    assert result.oom is not None and result.oom.phase == "init"
    assert result.findings[0].rule == "other-process"
    assert result.findings[0].confidence >= 0.8


def test_a_plain_allocator_oom_is_not_read_as_a_failed_context() -> None:
    text = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total)"

    result = explain_text(text)

    assert result.oom is not None and result.oom.phase is None


def test_an_older_xla_error_wrapped_between_out_and_of_memory_is_recognised() -> None:
    text = (
        "[1] 2019-06-13 01:17:08.886805: E external/org_tensorflow/tensorflow/compiler/xla/"
        "python/local_client.cc:672] Execution of replica 0 failed: Resource exhausted: Out \n"
        "of memory while trying to allocate 5520758552 bytes.\n"
    )

    found = parse_text(text)

    assert found is not None
    assert (found.framework, found.requested_bytes) == ("jax", 5520758552)
    assert "xla-temp-buffers" in [f.rule for f in explain_text(text).findings]


def test_a_wrapped_line_that_only_ends_in_out_is_not_a_memory_error() -> None:
    text = "Resource exhausted: Out\nof quota for this project.\n"

    assert parse_text(text) is None


def test_tensorflow_runtime_init_without_memory_is_a_failed_context() -> None:
    text = (
        "tensorflow.python.framework.errors_impl.InternalError: CUDA runtime implicit "
        "initialization on GPU:0 failed. Status: out of memory\n"
    )

    result = explain_text(text)

    assert result.oom is not None and result.oom.phase == "init"
    assert result.findings[0].rule == "other-process"


@pytest.mark.parametrize(
    ("text", "framework"),
    [
        pytest.param(
            "F0102 10:00:00.000000  4242 syncedmem.cpp:56] Check failed: error == cudaSuccess "
            "(2 vs. 0)  out of memory\n*** Check failure stack trace: ***\n",
            "caffe",
            id="caffe",
        ),
        pytest.param(
            "mxnet.base.MXNetError: [10:00:00] src/storage/./pooled_storage_manager.h:157: "
            "cudaMalloc failed: out of memory\n",
            "mxnet",
            id="mxnet",
        ),
        pytest.param(
            "THCudaCheck FAIL file=/tmp/luarocks_cutorch-scm-1-1234/cutorch/lib/THC/generic/"
            "THCStorage.cu line=66 error=2 : out of memory\n"
            "/home/u/torch/install/bin/luajit: cuda runtime error (2) : out of memory\n",
            "torch7",
            id="torch7-under-torch-install",
        ),
    ],
)
def test_an_unwatched_framework_is_named_and_preallocation_is_not_guessed(
    text: str, framework: str
) -> None:
    # None of these takes the device up front, so that cause is not among the guesses.
    result = explain_text(text)

    assert result.oom is not None and result.oom.framework == framework
    assert result.findings
    assert "framework-preallocation" not in [f.rule for f in result.findings]


def test_a_pool_failure_inside_cudnn_native_frames_is_cudnns() -> None:
    # glog prints the C++ stack under a failed CHECK; a cuDNN frame there means the memory was
    # for a convolution's algorithm search or workspace.
    text = (
        "F0102 10:00:00.000000  4242 gpu_memory.hpp:77] Check failed: try_reserve(size)\n"
        "*** Check failure stack trace: ***\n"
        "    @     0x7f0000000001  google::LogMessage::Fail()\n"
        "    @     0x7f0000000002  google::LogMessageFatal::~LogMessageFatal()\n"
        "    @     0x7f0000000003  caffe::CuDNNConvolutionLayer<>::FindExConvAlgo()\n"
    )

    result = explain_text(text)

    assert result.oom is not None and result.oom.library == "cudnn"
    assert "cudnn-workspace" in [f.rule for f in result.findings[:2]]


def test_a_cudnn_word_outside_the_native_stack_does_not_make_it_cudnns() -> None:
    text = (
        "F0102 10:00:00.000000  4242 gpu_memory.hpp:77] Check failed: try_reserve(size)\n"
        "*** Check failure stack trace: ***\n"
        "    @     0x7f0000000001  caffe::SyncedMemory::to_gpu()\n"
        "I0102 10:00:01.000000  4242 net.cpp:100] Creating layer conv1 (engine: CUDNN)\n"
    )

    found = parse_text(text)

    assert found is not None and found.library == "cuda"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "[>>>>>>>> ] 1022/5000, 1.5 task/s, elapsed: 673s, ETA: 2621s已杀死\n",
            id="zh-after-a-bar",
        ),
        pytest.param("[1]+  已杀死               python train.py\n", id="zh-job-line"),
        pytest.param(
            "./run.sh: 行 3: 12345 已杀死               python train.py\n", id="zh-script-line"
        ),
        pytest.param("Getötet\n", id="de"),
        pytest.param("強制終了\n", id="ja"),
    ],
)
def test_the_shells_killed_in_other_locales_is_a_host_kill(text: str) -> None:
    found = parse_text(text)

    assert found is not None and found.kind == "host-kill"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("这个进程已杀死了吗？我不知道\n", id="zh-in-a-sentence"),
        pytest.param("Der Prozess wurde nicht getötet, sondern beendet.\n", id="de-in-a-sentence"),
    ],
)
def test_the_word_in_a_sentence_is_not_a_kill(text: str) -> None:
    assert parse_text(text) is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("ERROR mlx5_0: ibv_create_cq() failed: Cannot allocate memory.\n", id="cq"),
        pytest.param(
            "node1:1234:1300 [0] NCCL INFO Call to ibv_reg_mr failed with error Cannot allocate "
            "memory\n",
            id="nccl-reg-mr",
        ),
    ],
)
def test_an_rdma_verbs_call_without_memory_hit_the_locked_memory_limit(text: str) -> None:
    # ibverbs' ENOMEM is RLIMIT_MEMLOCK (`ulimit -l`), not RAM.
    assert parse_text(text) is None


def test_a_frameworks_own_oom_beside_a_fault_on_one_line_is_still_read() -> None:
    # A log pasted without its line breaks: the OOM first, a later illegal access after it.
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 23.65 GiB of which 1.02 GiB is free. Including non-PyTorch memory, "
        "this process has 22.62 GiB memory in use. Of the allocated memory 21.90 GiB is "
        "allocated by PyTorch, and 253.10 MiB is reserved by PyTorch but unallocated. "
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )

    found = parse_text(text)

    assert found is not None and found.requested_bytes == 2 * 2**30


def test_paddle_says_where_and_how_much_was_free_and_explain_repeats_it() -> None:
    text = (
        "paddle.fluid.core_avx.EnforceNotMet: Out of memory error on GPU 0. Cannot allocate "
        "2.000000GB memory on GPU 0, 14.500000GB memory has been allocated and available memory "
        "is only 256.000000MB.\n"
    )

    result = explain_text(text)

    assert result.oom is not None
    assert (result.oom.device, result.oom.free_bytes) == (0, 256 * 2**20)
    assert result.oom.allocated_bytes == round(14.5 * 2**30)
    words = explain_in_words(result.oom)
    assert words.startswith("256 MiB were free on GPU 0; ")


@pytest.mark.parametrize(
    ("text", "framework"),
    [
        pytest.param(
            "-----------------------------------------------------------------------\n"
            "OutOfMemoryError                          Traceback (most recent call last)\n"
            "Cell In[21], line 2\n"
            "----> 2 eval_metrics = trainer.evaluate(metric_key_prefix='eval')\n",
            "pytorch",
            id="pytorch-cut-before-its-message",
        ),
        pytest.param(
            "ResourceExhaustedError                    Traceback (most recent call last)\n"
            "<ipython-input-3-abc> in <module>\n"
            "----> 1 model.fit(x, y)\n",
            "tensorflow",
            id="tensorflow",
        ),
    ],
)
def test_ipythons_traceback_header_names_the_memory_error(text: str, framework: str) -> None:
    found = parse_text(text)

    assert found is not None and found.framework == framework


def test_a_traceback_header_is_read_for_the_phase_its_frames_show() -> None:
    text = (
        "OutOfMemoryError                          Traceback (most recent call last)\n"
        "----> 2 eval_metrics = trainer.evaluate(metric_key_prefix='eval')\n"
    )

    found = parse_text(text)

    assert found is not None and found.phase == "eval"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("except OutOfMemoryError as error:\n    retry()\n", id="an-except-clause"),
        pytest.param("OutOfMemoryError handling is documented here", id="a-sentence"),
    ],
)
def test_the_class_name_in_code_or_prose_is_no_error(text: str) -> None:
    assert parse_text(text) is None


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        pytest.param("[launch.py:315] exits with return code = -7", "shm", id="deepspeed"),
        pytest.param(
            "ChildFailedError:\n  exitcode  : -7 (pid: 4242)\n  error_file: <N/A>",
            "shm",
            id="torchrun",
        ),
        pytest.param("Process finished with exit code 135", "shm", id="shell"),
        pytest.param("died with <Signals.SIGBUS: 7>.", "shm", id="python"),
        pytest.param("Process finished with exit code 1357", None, id="another-code"),
        pytest.param("exits with return code = -70", None, id="a-longer-code"),
    ],
)
def test_a_process_ended_by_sigbus_ran_out_of_shared_memory(text: str, kind: str | None) -> None:
    found = parse_text(text)

    assert (found.kind if found else None) == kind


def test_tensorflow_on_rocm_failing_to_allocate_from_the_device_is_a_device_error() -> None:
    text = (
        "2019-01-08 19:06:11.303639: E tensorflow/stream_executor/rocm/rocm_driver.cc:601] "
        "failed to allocate 7.35G (7889485824 bytes) from device: hipError_t(1002)\n"
    )

    found = parse_text(text)
    findings = explain_text(text).findings

    assert found is not None and (found.framework, found.library) == ("tensorflow", "hip")
    assert found.requested_bytes == 7889485824
    assert findings[0].rule == "framework-preallocation"


@pytest.mark.parametrize(
    ("text", "device_type"),
    [
        pytest.param("训练时显存不足", "gpu", id="video-memory-not-enough"),
        pytest.param("内存溢出", "cpu", id="memory-overflow"),
        pytest.param("GPU 内存不足", "gpu", id="gpu-named"),
        pytest.param("如何避免显存不足", None, id="how-to-avoid"),
        pytest.param("显存占用很高", None, id="high-usage-is-no-error"),
    ],
)
def test_a_chinese_headline_of_running_out_of_memory_is_read(
    text: str, device_type: str | None
) -> None:
    found = parse_text(text)

    assert (found.device_type if found else None) == device_type


@pytest.mark.parametrize(
    ("text", "library"),
    [
        pytest.param(
            "InternalError: Check failed: (__e == VK_SUCCESS) is false: Vulkan Error, code=-2: "
            "VK_ERROR_OUT_OF_DEVICE_MEMORY",
            "vulkan",
            id="vulkan",
        ),
        pytest.param(
            "DGLError: csr_transpose.cc:83: Check failed: e == CUSPARSE_STATUS_SUCCESS: "
            "CUSPARSE ERROR: 2",
            "cusparse",
            id="cusparse-by-number",
        ),
        pytest.param("RuntimeError: nvjpegDecode failed: 5", "nvjpeg", id="nvjpeg-by-number"),
    ],
)
def test_a_librarys_own_code_for_a_failed_allocation_is_a_device_memory_error(
    text: str, library: str
) -> None:
    found = parse_text(text)
    findings = explain_text(text).findings

    assert found is not None and (found.kind, found.library) == ("disguised", library)
    assert findings, "the commonest causes, as for any device error without figures"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("RuntimeError: nvjpegDecode failed: 3", id="nvjpeg-bad-jpeg"),
        pytest.param("CUSPARSE ERROR: 3 (invalid value)", id="cusparse-invalid-value"),
        pytest.param("VK_ERROR_DEVICE_LOST", id="vulkan-device-lost"),
    ],
)
def test_other_codes_of_the_same_libraries_are_no_memory_error(text: str) -> None:
    assert parse_text(text) is None


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        pytest.param("inference CUDA OutOfMemoryError", "disguised", id="class-name-in-a-title"),
        pytest.param("No way to clear shader cache : out of GPU memory", "disguised", id="gpu"),
        pytest.param(
            "Mistral kills the process by taking too many RAM", "host-kill", id="kills-for-ram"
        ),
        pytest.param("[rank: 1] Child process terminated with code -9", "host-kill", id="rank"),
        pytest.param("how to avoid OutOfMemoryError", None, id="advice"),
        pytest.param("killing the process frees the memory", None, id="killing-to-free"),
        pytest.param("The timeout kills the process after 10 minutes", None, id="timeout"),
        pytest.param(
            "Exception: Process exited with code 137 after test timeout of 600s (killed by the "
            "test harness)",
            None,
            id="exit-137-by-a-timeout",
        ),
    ],
)
def test_titles_and_exit_lines_are_memory_errors_only_when_memory_is_blamed(
    text: str, kind: str | None
) -> None:
    found = parse_text(text)

    assert (found.kind if found else None) == kind


@pytest.mark.parametrize(
    ("text", "device_type", "library"),
    [
        pytest.param(
            "lightgbm.basic.LightGBMError: Memory Object Allocation Failure",
            "gpu",
            "opencl",
            id="opencl-by-lightgbm",
        ),
        pytest.param("Out of memory error on T4 instance", "gpu", "cuda", id="a-gpu-named"),
        pytest.param(
            "terminate called after throwing an instance of 'thrust::system::system_error'\n"
            "  what():  parallel_for failed: out of memory",
            "gpu",
            "cuda",
            id="thrust-above-its-what",
        ),
        pytest.param(
            "fatal: Out of memory, malloc failed (tried to allocate 123 bytes)",
            "cpu",
            None,
            id="malloc-on-the-host",
        ),
    ],
)
def test_an_out_of_memory_line_is_the_devices_when_it_or_the_line_above_names_one(
    text: str, device_type: str, library: str | None
) -> None:
    found = parse_text(text)

    assert found is not None and (found.device_type, found.library) == (device_type, library)
