"""Memory errors in wordings met in real threads: TensorRT, OpenVINO, a job runner's exit
status, and XLA's peak-buffer listing pasted without its error line."""

from __future__ import annotations

import pytest

from memdoc.oom import parse_all, parse_text
from memdoc.rules.engine import explain_text

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
