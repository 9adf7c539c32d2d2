"""The engine: findings best first, broken rules contained, ranks merged, the JSON contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memdoc.rules.base import Finding
from memdoc.rules.confidence import confidence_word
from memdoc.rules.context import Facts
from memdoc.rules.engine import diagnose, diagnose_run, explain_text, to_json
from memdoc.rules.registry import RULES
from memdoc.rules.words import explain_in_words
from memdoc.trace import OomInfo, ProcessUsage, load_trace
from memdoc.trace.reader import Run
from tests.rules.fixture_cases import RULE_FIXTURES
from tests.rules.recorder import GiB, MiB, Recorder, train_steps

SGLANG = (RULE_FIXTURES / "fragmentation" / "miss-cache-smaller-than-request.txt").read_text()
CROSSFIT = (RULE_FIXTURES / "fragmentation" / "hit-reserved-unallocated.txt").read_text()
UGATIT = (RULE_FIXTURES / "leak-across-steps" / "hit-late-epoch.txt").read_text()


def test_findings_come_best_first() -> None:
    found = explain_text(CROSSFIT).findings

    assert [f.rule for f in found][0] == "fragmentation"
    assert [f.confidence for f in found] == sorted((f.confidence for f in found), reverse=True)


class _BrokenRule:
    slug = "broken"
    code = "MD999"
    title = "always raises"
    doc = ""

    def check(self, facts: Facts) -> Finding | None:
        raise ZeroDivisionError("a bug in the rule")


def test_a_rule_that_raises_is_left_out_with_a_warning_and_the_others_still_report() -> None:
    trace = load_trace(RULE_FIXTURES / "host-oom" / "hit-sigkill-near-limit.memdoc")
    before = list(trace.warnings)

    found = diagnose(trace, rules=[_BrokenRule(), RULES["host-oom"]])

    assert [f.rule for f in found] == ["host-oom"]
    assert any("rule broken failed" in w and "ZeroDivisionError" in w for w in found.warnings)
    assert trace.warnings == before  # diagnose never changes the trace it is given


def test_a_failed_rule_is_named_in_the_report_beside_the_runs_warnings() -> None:
    from memdoc.report.data import ReportData

    trace = load_trace(RULE_FIXTURES / "host-oom" / "hit-sigkill-near-limit.memdoc")
    found = diagnose(trace, rules=[_BrokenRule(), RULES["host-oom"]])

    data = ReportData.from_run(Run([trace]), found)

    assert any("rule broken failed" in w for w in data.warnings)


def _leaking_rank(path: Path, rank: int, fail_at_step: int | None) -> None:
    rec = Recorder(path, rank=rank, world_size=2, pid=6000 + rank)
    rec.device(rank, 24 * GiB, "NVIDIA RTX A5000")
    t = train_steps(
        rec, 12, baseline=lambda k: 4 * GiB + k * 200 * MiB, rise=lambda k: 2 * GiB, device=rank
    )
    if fail_at_step is not None:
        oom = OomInfo(framework="pytorch", device=rank, requested_bytes=GiB, total_bytes=24 * GiB)
        rec.oom(t + 0.2, oom)
        rec.end(t + 0.5, exit_code=1)
    else:
        rec.end(t + 30, exit_code=1)


def test_a_run_of_ranks_reports_each_cause_once_with_its_rank_and_who_failed_first(
    tmp_path: Path,
) -> None:
    _leaking_rank(tmp_path / "r0.memdoc", 0, fail_at_step=None)
    _leaking_rank(tmp_path / "r1.memdoc", 1, fail_at_step=12)
    run = Run([load_trace(tmp_path / "r0.memdoc"), load_trace(tmp_path / "r1.memdoc")])

    found = diagnose_run(run)

    leaks = [f for f in found if f.rule == "leak-across-steps"]
    assert len(leaks) == 1 and leaks[0].rank == 1
    assert any("ranks where it was seen (0, 1) of 2" in e.text for e in leaks[0].evidence)
    first = next(f for f in found if f.rule == "rank-failed-first")
    assert first.rank == 1


def test_plain_words_say_what_the_numbers_mean() -> None:
    oom = explain_text(SGLANG).oom
    assert oom is not None

    assert explain_in_words(oom) == (
        "Of 15.6 GiB on GPU 0, 71.2 MiB were free; this process held 13.9 GiB, of which PyTorch "
        "had allocated 13.6 GiB and cached 67.2 MiB but not used it; the request was 226 MiB."
    )


@pytest.mark.parametrize(
    ("oom", "expected"),
    [
        pytest.param(
            OomInfo(framework="host", kind="host-kill"),
            "The process was killed (SIGKILL), which is what the kernel's out-of-memory killer",
            id="host-kill",
        ),
        pytest.param(
            OomInfo(framework="host", kind="host-kill", limit_bytes=16384000 * 1024),
            "; the limit was 15.6 GiB.",
            id="host-kill-under-a-scheduler-limit",
        ),
        pytest.param(
            OomInfo(framework="pytorch", kind="disguised", library="vllm"),
            "vLLM refused to start",
            id="vllm-kv-cache",
        ),
        pytest.param(
            OomInfo(framework="tensorflow", kind="disguised", library="cudnn"),
            "out-of-memory error in disguise: cuDNN",
            id="disguised",
        ),
        pytest.param(
            OomInfo(
                framework="tensorflow",
                shape=(64, 372, 32, 32),
                dtype="float",
                requested_bytes=97517568,
            ),
            "The tensor of shape [64, 372, 32, 32] (float) needed 93 MiB.",
            id="tensorflow-shape",
        ),
        pytest.param(
            OomInfo(framework="pytorch", requested_unknown_huge=True),
            "absurdly large",
            id="overflowed-request",
        ),
        pytest.param(
            OomInfo(
                framework="pytorch",
                device=0,
                total_bytes=24 * GiB,
                free_bytes=7 * GiB,
                this_process_bytes=2**64,
                allocated_bytes=14 * GiB,
                requested_bytes=20 * MiB,
            ),
            "Of 24 GiB on GPU 0, 7 GiB were free; PyTorch had allocated 14 GiB",
            id="nvml-sentinel-ignored",
        ),
        pytest.param(
            OomInfo(
                framework="pytorch",
                device=0,
                total_bytes=24 * GiB,
                free_bytes=1 * GiB,
                this_process_bytes=9 * GiB,
                processes=(ProcessUsage(1, 14 * GiB), ProcessUsage(2, 9 * GiB, True)),
                requested_bytes=2 * GiB,
            ),
            "this process held 9 GiB; 1 other process held 14 GiB; the request was 2 GiB.",
            id="other-processes",
        ),
    ],
)
def test_plain_words_for_every_kind_of_error(oom: OomInfo, expected: str) -> None:
    assert expected in explain_in_words(oom)


def test_json_contract_holds_the_parsed_error_and_findings_best_first() -> None:
    result = explain_text(CROSSFIT)

    data = json.loads(json.dumps(to_json(result.oom, result.findings)))

    assert set(data) == {"oom", "findings"}
    assert data["oom"]["framework"] == "pytorch" and data["oom"]["requested_bytes"] == 12 * GiB
    top = data["findings"][0]
    assert {"rule", "code", "title", "confidence", "evidence", "fixes"} <= set(top)
    assert top["rule"] == "fragmentation" and 0 <= top["confidence"] <= 1
    assert all({"framework", "title", "code"} <= set(fix) for fix in top["fixes"])
    assert to_json(None, []) == {"oom": None, "findings": []}


def test_text_alone_can_only_make_a_leak_possible_and_says_what_to_record() -> None:
    leak = next(f for f in explain_text(UGATIT).findings if f.rule == "leak-across-steps")

    assert confidence_word(leak.confidence) == "possible"
    assert leak.to_confirm is not None and "memdoc run" in leak.to_confirm


def test_a_text_without_a_memory_error_gets_no_findings() -> None:
    result = explain_text("Traceback (most recent call last):\nValueError: bad input shape\n")

    assert result.oom is None and result.findings == []
