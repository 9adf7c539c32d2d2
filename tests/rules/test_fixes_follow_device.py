"""A fix names the device the run used: no CUDA advice for a run that had no GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memdoc.rules.engine import diagnose, explain_text
from memdoc.rules.host import cpu_only
from memdoc.rules.registry import RULES
from tests.rules.fixture_cases import RULE_FIXTURES, all_cases

CUDA = re.compile(r"cuda|CUDA|\bfloat16\b|mixed_float16")
HOST_TRACES = [
    c
    for c in all_cases()
    if c.expect != "none" and c.path.suffix == ".memdoc" and cpu_only(c.trace())
]


def test_some_recorded_fixtures_are_cpu_only_runs() -> None:
    assert {c.slug for c in HOST_TRACES} >= {"activations-too-large", "host-oom"}


@pytest.mark.parametrize("case", HOST_TRACES, ids=lambda c: c.id)
def test_no_fix_for_a_cpu_only_run_names_cuda(case: object) -> None:
    trace = case.trace()  # type: ignore[attr-defined]

    for finding in diagnose(trace):
        for fix in finding.fixes:
            assert not CUDA.search(fix.code), (finding.rule, fix.title, fix.code)


def test_mixed_precision_on_a_cpu_run_autocasts_on_the_cpu() -> None:
    trace = (RULE_FIXTURES / "activations-too-large" / "hit-host-step-peaks.memdoc").as_posix()
    found = [f for f in diagnose(_load(trace)) if f.rule == "activations-too-large"]

    codes = [fix.code for fix in found[0].fixes]
    assert any('torch.autocast(device_type="cpu"' in code for code in codes)


def test_a_gpu_run_keeps_its_cuda_fixes() -> None:
    trace = (RULE_FIXTURES / "activations-too-large" / "hit-step-peaks.memdoc").as_posix()
    found = [f for f in diagnose(_load(trace)) if f.rule == "activations-too-large"]

    codes = [fix.code for fix in found[0].fixes]
    assert any('torch.autocast(device_type="cuda"' in code for code in codes)


def test_an_error_text_about_a_gpu_keeps_gpu_fixes() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 3.00 GiB is free. Of the allocated memory 50.00 "
        "GiB is allocated by PyTorch, and 20.00 GiB is reserved by PyTorch but unallocated.\n"
    )

    found = {f.rule: f for f in explain_text(text).findings}

    assert any("PYTORCH_CUDA_ALLOC_CONF" in fix.code for fix in found["fragmentation"].fixes)


def test_every_fix_that_names_cuda_is_gpu_only_or_renamed_on_the_cpu() -> None:
    from memdoc.rules.spec import fixes_for_host

    for rule in RULES.values():
        for fix in fixes_for_host(rule.fixes):  # type: ignore[attr-defined]
            if CUDA.search(fix.code):
                assert fix.gpu_only, (rule.slug, fix.title)


def _load(path: str):  # type: ignore[no-untyped-def]
    from memdoc.trace import load_trace

    return load_trace(path)


LOAD_UNDER_CAP = RULE_FIXTURES / "checkpoint-load-spike" / "hit-cpu-load-under-cap.memdoc"


def test_a_checkpoint_loaded_on_the_cpu_under_a_cap_is_told_in_host_words_with_fixes_that_fit() -> (
    None
):
    # A real PyTorch program (tests/rules/programs/torch_load_under_cap.py) ran out inside
    # torch.load under its address-space cap: no GPU in the title, and no memory-mapped load,
    # which maps the whole file into the address space the cap counts.
    found = {f.rule: f for f in diagnose(_load(LOAD_UNDER_CAP.as_posix()))}
    load = found["checkpoint-load-spike"]
    assert load.title == "Loading a checkpoint doubles memory"
    assert "GPU" not in load.summary + (load.to_confirm or "")
    assert load.fixes[0].code.count("assign=True") == 1
    assert not any("mmap" in fix.code for fix in load.fixes)
    assert found["host-oom"].title == "The host ran out of memory"


def test_the_same_load_on_a_gpu_run_keeps_its_gpu_title_and_the_mapped_load() -> None:
    trace = (RULE_FIXTURES / "checkpoint-load-spike" / "hit-load-mark-spike.memdoc").as_posix()
    load = next(f for f in diagnose(_load(trace)) if f.rule == "checkpoint-load-spike")
    assert load.title == "Loading a checkpoint onto the GPU doubles memory"
    assert any("mmap=True" in fix.code for fix in load.fixes)


@pytest.mark.torch
def test_the_fix_given_for_the_load_under_the_cap_loads_under_the_same_cap() -> None:
    program = Path(__file__).resolve().parent / "programs" / "torch_load_under_cap.py"
    plain = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, timeout=120, check=False
    )
    fixed = subprocess.run(
        [sys.executable, str(program)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "FIX": "assign"},
    )
    assert plain.returncode != 0 and "can't allocate memory" in plain.stderr
    assert fixed.returncode == 0 and "loaded" in fixed.stdout, fixed.stderr[-1000:]
