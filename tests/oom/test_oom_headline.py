"""A memory error told in one short line, as a report's title or a notebook's last words."""

from __future__ import annotations

import pytest

from memdoc.oom import parse_all, parse_text


@pytest.mark.parametrize(
    ("text", "kind", "device_type", "phase"),
    [
        pytest.param('"out of memory" during validation', "disguised", "gpu", "eval", id="quoted"),
        pytest.param(
            "GPU 0 out of memory even if assigning one GPU for each model in multiprocessing",
            "disguised",
            "gpu",
            None,
            id="gpu-n",
        ),
        pytest.param(
            "CUDA OOM when loading optimizer state dict", "disguised", "gpu", "load", id="oom-word"
        ),
        pytest.param(
            "FFHQ checkpoint leads to out of memory even on single image inference",
            "disguised",
            "gpu",
            "eval",
            id="inference",
        ),
        pytest.param(
            "if EVAL in the middle of the training, CUDA Memory Error",
            "disguised",
            "gpu",
            None,
            id="memory-error",
        ),
        pytest.param(
            '"Killed" without error during "from_pretrained"',
            "host-kill",
            "cpu",
            None,
            id="quoted-killed",
        ),
        pytest.param("Training killed KWS20", "host-kill", "cpu", None, id="training-killed"),
        pytest.param(
            "Out of memory in host RAM while building the index",
            "host-alloc",
            "cpu",
            None,
            id="host-words",
        ),
    ],
)
def test_a_headline_that_states_a_memory_error_is_read_as_one(
    text: str, kind: str, device_type: str, phase: str | None
) -> None:
    oom = parse_text(text)

    assert oom is not None
    assert (oom.kind, oom.device_type) == (kind, device_type)
    if phase is not None:
        assert oom.phase == phase


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Tips to avoid OOM on long sequences", id="how-to-avoid"),
        pytest.param("Training runs with no OOM at batch size 8", id="no-oom"),
        pytest.param("You may run out of memory with batch size 512.", id="advice"),
        pytest.param("Killed the stale run before starting", id="killed-as-a-verb"),
        pytest.param("Training job was killed by the SLURM time limit", id="killed-for-time"),
        pytest.param("Use --oom-free-mode for long sequences", id="oom-free"),
        pytest.param(
            "\n".join(f"step {i} loss=0.5 (no retry after OOM guard)" for i in range(3))
            + "\nepoch 1 done, CUDA OOM guard armed",
            id="a-log-not-a-headline",
        ),
    ],
)
def test_a_line_that_mentions_memory_without_stating_a_failure_is_not_one(text: str) -> None:
    assert parse_all(text) == []


def test_the_same_words_inside_a_longer_log_are_not_read_as_a_headline() -> None:
    noise = "2024-05-01 12:00:00 INFO step 10 loss=0.5000\n" * 5

    assert parse_text("CUDA OOM when loading optimizer state dict") is not None
    assert parse_all(noise + "CUDA OOM when loading optimizer state dict\n") == []


@pytest.mark.parametrize(
    ("text", "kind", "framework"),
    [
        pytest.param(
            "Emulation speed 100.0%\n[1]    1819 killed    python3 dddqn_train.py results",
            "host-kill",
            "host",
            id="zsh-job-line",
        ),
        pytest.param("loading data\nKilled.", "host-kill", "host", id="killed-with-a-period"),
        pytest.param(
            "Your session crashed after using all available RAM.", "host-kill", "host", id="colab"
        ),
        pytest.param(
            "Your notebook tried to allocate more memory than is available. It has restarted.",
            "host-kill",
            "host",
            id="kaggle",
        ),
        pytest.param(
            "E cuda_dnn.cc:329] Could not run conv: CUDNN_STATUS_INTERNAL_ERROR",
            "disguised",
            "unknown",
            id="cudnn-internal-error",
        ),
        pytest.param(
            "Unexpected BUS error encountered in DataLoader worker. This might be caused by "
            "insufficient shared memory (shm), please check whether use_shared_memory is set",
            "shm",
            "host",
            id="paddle-bus-error",
        ),
        pytest.param(
            "ERROR: Unexpected bus error encountered in worker. This might be caused by "
            "insufficient shared memory (shm).",
            "shm",
            "pytorch",
            id="pytorch-bus-error",
        ),
    ],
)
def test_host_failures_in_the_shells_and_loaders_other_wordings(
    text: str, kind: str, framework: str
) -> None:
    oom = parse_text(text)

    assert oom is not None
    assert (oom.kind, oom.framework) == (kind, framework)


def test_a_traceback_pasted_without_its_line_breaks_still_shows_its_error() -> None:
    flattened = (
        "return torch._C._nn.cross_entropy_loss(input, target, weight, ignore_index)"
        + " " * 60
        + "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 250.00 MiB "
        "(GPU 1; 31.75 GiB total capacity; 30.35 GiB already allocated; 209.75 MiB free)"
    )
    quoted = 'if "CUDA out of memory. Tried to allocate" in str(err):'

    oom = parse_text(flattened)

    assert oom is not None and oom.requested_bytes == 250 * 2**20 and oom.device == 1
    assert parse_all(quoted) == []
