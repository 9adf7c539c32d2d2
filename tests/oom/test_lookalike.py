"""Failures that name a limit other than the memory's size are not read as memory errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdoc.cli.main import main
from memdoc.oom import parse_text
from memdoc.oom.lookalike import LOCKED_MEMORY, MAP_COUNT, QUOTA, other_limit
from memdoc.rules.engine import explain_text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param(
            "warning: failed to mlock 139264000-byte buffer (after previously locking 0 bytes): "
            "Cannot allocate memory\nTry increasing RLIMIT_MLOCK ('ulimit -l' as root).",
            LOCKED_MEMORY,
            id="llama-cpp-mlock",
        ),
        pytest.param(
            "allocate memory : Please set max locked memory (ulimit -l) to 'unlimited' "
            "(current: 8192 kbytes)\nUCX  ERROR mlx5_0: mlx5dv_devx_umem_reg(size=131072 "
            "access=0x0) failed: Cannot allocate memory",
            LOCKED_MEMORY,
            id="ucx-memlock",
        ),
        pytest.param(
            "RuntimeError: unable to mmap 4096 bytes from file </torch_362873_3123855485_63350>: "
            "Cannot allocate memory (12)",
            MAP_COUNT,
            id="torch-shared-page",
        ),
        pytest.param(
            "Allocator: Cannot mmap 4.00 KiB., errno: 12, strerror: Cannot allocate memory",
            MAP_COUNT,
            id="clickhouse-kib",
        ),
        pytest.param(
            "mmap failed: Cannot allocate memory; check vm.max_map_count",
            MAP_COUNT,
            id="named-map-count",
        ),
        pytest.param(
            "Checkpoint save : tensorflow.python.framework.errors_impl.ResourceExhaustedError: "
            "disk quota exceeded [Op:SaveV2]",
            QUOTA,
            id="tensorflow-disk-quota",
        ),
    ],
)
def test_a_failure_naming_another_limit_is_no_memory_error(text: str, why: str) -> None:
    result = explain_text(text)

    assert parse_text(text) is None
    assert result.oom is None and result.findings == []
    assert result.not_memory == why


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "RuntimeError: unable to mmap 4294967296 bytes from file </torch_1_2_3>: "
            "Cannot allocate memory (12)",
            id="a-large-mapping-is-memory",
        ),
        pytest.param("OSError: [Errno 12] Cannot allocate memory", id="plain-enomem"),
        pytest.param(
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
            "tensor with shape[1024,1024,64] and type float",
            id="tensorflow-oom",
        ),
        pytest.param(
            "mlock is off in this build\n\n\n\n\nOSError: [Errno 12] Cannot allocate memory",
            id="a-limit-named-far-above",
        ),
    ],
)
def test_the_same_words_without_another_limit_stay_a_memory_error(text: str) -> None:
    assert parse_text(text) is not None
    assert other_limit(text.splitlines()[-1]) is None


def test_explain_says_which_limit_it_was_and_finds_no_memory_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "crash.log"
    log.write_text(
        "RuntimeError: unable to mmap 4096 bytes from file </torch_1_2_3>: "
        "Cannot allocate memory (12)\n"
    )

    code = main(["explain", str(log)])

    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "No memory error found" in out and "vm.max_map_count" in out
