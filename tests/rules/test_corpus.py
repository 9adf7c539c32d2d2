"""The labelled corpus of real incidents: how often explain agrees (reported, not gated).

The dev corpus is a sample of a larger population, so no incident is special-cased; the
agreement is printed (`pytest -s`) to follow calibration, and only the mapping is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memdoc.rules.engine import explain_text
from memdoc.rules.registry import RULES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CORPUS = FIXTURES / "oom-corpus-dev.jsonl"
NON_MEMORY = FIXTURES / "non-memory-errors.jsonl"

# The corpus's cause labels, in the catalogue's terms. A label maps to every slug that names
# that cause; "other" names none.
LABEL_TO_SLUGS: dict[str, tuple[str, ...]] = {
    "batch_or_input_too_large": ("activations-too-large", "single-allocation-too-large"),
    "cudnn_workspace_or_benchmark": ("cudnn-workspace",),
    "eval_without_no_grad": ("eval-without-no-grad",),
    "framework_preallocation": ("framework-preallocation",),
    "host_oom": ("host-oom",),
    "leak_accumulation": ("leak-across-steps", "retain-graph"),
    "multi_framework_same_process": ("multi-framework",),
    "other_process": ("other-process",),
    "fragmentation": ("fragmentation",),
    "model_too_large": ("model-too-large",),
    "optimizer_state": ("optimizer-state",),
    "checkpoint_load": ("checkpoint-load-spike",),
    "memory_fraction_cap": ("memory-fraction-cap",),
    "nccl": ("nccl-buffers",),
    "xla_temp_buffers": ("xla-temp-buffers",),
    "cuda_graphs": ("cuda-graph-pools",),
    "other": (),
}


def _incidents(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_every_corpus_label_maps_to_registered_rules() -> None:
    labels = {str(i["root_cause"]) for i in _incidents(CORPUS)}
    labels |= {str(i["secondary_cause"]) for i in _incidents(CORPUS) if i["secondary_cause"]}
    assert labels <= set(LABEL_TO_SLUGS), labels - set(LABEL_TO_SLUGS)
    assert {s for slugs in LABEL_TO_SLUGS.values() for s in slugs} <= set(RULES)


def test_report_agreement_with_the_labelled_corpus(capsys: pytest.CaptureFixture[str]) -> None:
    """Top-1: the best finding names the root cause. Top-3: root or secondary in the first three."""
    incidents = _incidents(CORPUS)
    top1 = top3 = 0
    lines = []
    for incident in incidents:
        root = set(LABEL_TO_SLUGS[str(incident["root_cause"])])
        either = root | set(LABEL_TO_SLUGS.get(str(incident["secondary_cause"]), ()))
        ranked = [f.rule for f in explain_text(str(incident["error_text"])).findings]
        hit1 = bool(ranked) and ranked[0] in root
        hit3 = bool(either & set(ranked[:3]))
        top1 += hit1
        top3 += hit3
        mark = "top-1" if hit1 else "top-3" if hit3 else "miss"
        lines.append(f"  {mark:5}  {incident['id']:28} wanted {sorted(either)} got {ranked[:3]}")
    with capsys.disabled():
        print(f"\ncorpus agreement: top-1 {top1}/{len(incidents)}, top-3 {top3}/{len(incidents)}")
        print("\n".join(lines))
    assert incidents


@pytest.mark.parametrize("incident", _incidents(NON_MEMORY), ids=lambda i: str(i.get("id", "?")))
def test_errors_that_are_not_about_memory_get_no_findings(incident: dict[str, object]) -> None:
    result = explain_text(str(incident["error_text"]))

    assert result.oom is None and result.findings == []
