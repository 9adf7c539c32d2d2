"""A fix names the device the run used: no CUDA advice for a run that had no GPU."""

from __future__ import annotations

import re

import pytest

from memdoc.rules.engine import diagnose, explain_text
from memdoc.rules.registry import RULES
from memdoc.rules.spec import cpu_only
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
