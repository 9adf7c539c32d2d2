"""Errors inside real-looking logs: found in order, echoes merged, re-flowed text read whole."""

from __future__ import annotations

import random
import textwrap
import time

import pytest
from oomtext import CATALOGUE, fenced, gib, mib, text_of

from memdoc.oom import looks_like_memory_error, parse_all, parse_text

PYTORCH_2_2 = fenced(CATALOGUE, "### 1g", 0)
FIELDS = (
    "requested_bytes",
    "total_bytes",
    "free_bytes",
    "this_process_bytes",
    "allocated_bytes",
    "reserved_unallocated_bytes",
    "device",
)


def noise_line(rng: random.Random, index: int) -> str:
    """A line of an ordinary training log."""
    choice = rng.random()
    if choice < 0.6:
        return (
            f"2024-05-01 12:{index % 60:02d}:07,123 INFO trainer: epoch {index // 900} step"
            f" {index} loss={rng.random():.4f} lr=3.0e-04 grad_norm={rng.random() * 3:.2f}"
        )
    if choice < 0.8:
        return f" 45%|████▌     | {index}/{index * 2} [01:23<01:40,  1.{index % 10}it/s]"
    if choice < 0.95:
        return (
            "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:558: UserWarning:"
            " This DataLoader will create 16 worker processes in total."
        )
    return '  File "/srv/train.py", line 120, in train_step\n    loss.backward()'


def noisy_log(errors: dict[int, str], lines: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    for index in range(lines):
        if index in errors:
            out.append(errors[index])
        out.append(noise_line(rng, index))
    return "\n".join(out)


def line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_several_errors_in_a_long_log_are_found_in_order_and_the_last_ends_it() -> None:
    """GIVEN a 6000-line log with a PyTorch, a TensorFlow, a JAX OOM and a final kill."""
    errors = {
        1000: "[rank1]: " + PYTORCH_2_2,
        2500: text_of("tf-cpu-bfc-dump.txt"),
        4000: fenced(CATALOGUE, "### 6c", 0),
        5990: "Killed",
    }
    log = noisy_log(errors, 6000)
    # WHEN
    found = parse_all(log)
    # THEN
    assert [(info.framework, info.kind) for info in found] == [
        ("pytorch", "allocator"),
        ("tensorflow", "allocator"),
        ("jax", "compile"),
        ("host", "host-kill"),
    ]
    assert found[0].rank == 1
    assert found[0].line == line_of(log, "[rank1]: torch.OutOfMemoryError")
    assert found[1].line == line_of(log, "Allocator (bfc_cpu_allocator_for_gpu)")
    assert found[1].bfc_limit_bytes == mib(256)
    assert found[2].line == line_of(log, "jaxlib.xla_extension.XlaRuntimeError")
    assert found[3].line == line_of(log, "\nKilled\n") + 1
    assert parse_text(log) == found[-1]
    assert looks_like_memory_error(log)


def test_a_log_without_memory_errors_gives_none() -> None:
    log = noisy_log({}, 3000)
    assert parse_all(log) == []
    assert parse_text(log) is None


def test_error_echoed_by_a_chained_traceback_is_one_error() -> None:
    text = (
        f"{PYTORCH_2_2}\n\nDuring handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "train.py", line 40, in <module>\n'
        f"    main()\nRuntimeError: {PYTORCH_2_2.split(': ', 1)[1]}"
    )
    found = parse_all(text)
    assert len(found) == 1
    assert found[0].line == 1


def test_the_same_message_far_apart_is_two_errors() -> None:
    log = noisy_log({100: PYTORCH_2_2, 2000: PYTORCH_2_2}, 2200)
    assert len(parse_all(log)) == 2


def test_each_rank_keeps_its_own_error_even_when_their_lines_interleave() -> None:
    lines = []
    for rank in range(4):
        lines.append(f"[rank{rank}]: Traceback (most recent call last):")
    for rank in range(4):
        lines.append(f"[rank{rank}]: {PYTORCH_2_2}")
    for rank in range(4):
        lines.append(f"[rank{rank}]: {PYTORCH_2_2}")  # each rank's echo
    found = parse_all("\n".join(lines))
    assert [info.rank for info in found] == [0, 1, 2, 3]


def test_distinct_devices_without_rank_prefixes_stay_distinct() -> None:
    text = "\n".join(PYTORCH_2_2.replace("GPU 0 has", f"GPU {d} has") for d in range(3))
    assert [info.device for info in parse_all(text)] == [0, 1, 2]


def _fixed_width(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_fixed_width(PYTORCH_2_2, 80), id="terminal-wrap-80"),
        pytest.param(_fixed_width(PYTORCH_2_2, 37), id="terminal-wrap-37-mid-number"),
        pytest.param("\n".join(textwrap.wrap(PYTORCH_2_2, 70)), id="wrapper-drops-spaces"),
        pytest.param(
            "\n".join("[rank0]: " + part for part in textwrap.wrap(PYTORCH_2_2, 70)),
            id="rank-prefix-on-every-line",
        ),
        pytest.param(
            "\n".join("E       " + part for part in _fixed_width(PYTORCH_2_2, 80).split("\n")),
            id="pytest-e-prefix",
        ),
        pytest.param(PYTORCH_2_2.replace("  ", " "), id="single-spaces"),
        pytest.param(PYTORCH_2_2.replace(". ", ".  "), id="double-spaces"),
        pytest.param(PYTORCH_2_2.replace("\n", "\r\n") + "\r\n", id="crlf"),
    ],
)
def test_reflowed_message_gives_the_same_numbers(text: str) -> None:
    expected = parse_text(PYTORCH_2_2)
    info = parse_text(text)
    assert expected is not None and info is not None
    assert len(parse_all(text)) == 1
    for name in FIELDS:
        assert getattr(info, name) == getattr(expected, name), name
    assert info.requested_bytes == mib(226)
    assert info.total_bytes == gib(15.58)


@pytest.mark.parametrize(
    ("frames", "phase"),
    [
        pytest.param("    model.load_state_dict(torch.load(path))", "load", id="torch-load"),
        pytest.param(
            '  File "/x/transformers/modeling_utils.py", line 3, in from_pretrained',
            "load",
            id="from-pretrained",
        ),
        pytest.param('  File "train.py", line 88, in evaluate', "eval", id="evaluate"),
        pytest.param('  File "train.py", line 88, in validate', "eval", id="validate"),
        pytest.param("    out = model.generate(**inputs)", "eval", id="generate"),
        pytest.param('  File "train.py", line 12, in train_step', "train", id="train-step"),
        pytest.param('  File "x/torch/_inductor/compile_fx.py", line 3, in compile_fx', "compile"),
    ],
)
def test_phase_comes_from_the_innermost_telling_frame(frames: str, phase: str) -> None:
    text = (
        'Traceback (most recent call last):\n  File "train.py", line 200, in <module>\n'
        f"    main()\n{frames}\n{PYTORCH_2_2}"
    )
    info = parse_text(text)
    assert info is not None
    assert info.phase == phase


def test_phase_looks_only_at_the_traceback_that_ends_in_the_error() -> None:
    text = (
        'Traceback (most recent call last):\n  File "t.py", line 1, in evaluate\nValueError: x\n'
        'Traceback (most recent call last):\n  File "t.py", line 2, in <module>\n'
        f"{PYTORCH_2_2}"
    )
    info = parse_text(text)
    assert info is not None and info.phase is None


def test_zero_free_in_the_new_wording_is_zero_not_unknown() -> None:
    text = PYTORCH_2_2.replace("of which 71.25 MiB is free", "of which 0 bytes is free")
    info = parse_text(text)
    assert info is not None and info.free_bytes == 0


def test_a_five_megabyte_noisy_log_with_a_one_megabyte_line_parses() -> None:
    """Linear time: no pattern backtracks on long lines or digit runs (bound is generous)."""
    rng = random.Random(3)
    lines = [noise_line(rng, i) for i in range(45000)]
    lines.insert(20000, "x" * 1_000_000)
    lines.insert(21000, "9" * 200_000 + " GiB memory in use " + "out of memory " * 1000)
    lines.insert(30000, PYTORCH_2_2)
    text = "\n".join(lines)
    assert len(text) > 5_000_000
    start = time.perf_counter()
    found = parse_all(text)
    elapsed = time.perf_counter() - start
    assert any(info.requested_bytes == mib(226) for info in found)
    assert elapsed < 20
