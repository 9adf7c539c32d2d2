"""A bare error is read through how often each cause ends real incidents."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.corpus import load_incidents
from memdoc.rules.engine import BARE_WARNING, explain_text
from memdoc.rules.priors import INCIDENTS_BY_CAUSE, common_causes, prior_rank


def test_the_prior_table_is_the_count_of_the_corpus_development_half() -> None:
    counted = Counter(i.root_cause for i in load_incidents() if i.split == "dev")

    assert INCIDENTS_BY_CAUSE == dict(counted)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("CUDA out of memory\n", id="bare-words"),
        pytest.param("torch.cuda.OutOfMemoryError: Allocation on device\n", id="allocation"),
    ],
)
def test_a_bare_error_names_the_commonest_causes_and_says_the_text_cannot_tell(
    text: str,
) -> None:
    result = explain_text(text)

    ranked = [f.rule for f in result.findings]
    assert result.oom is not None
    assert ranked[:3] == list(common_causes(result.oom.framework))
    assert all(f.confidence < 0.4 for f in result.findings)
    assert BARE_WARNING in result.warnings
    added = [f for f in result.findings if "cannot tell" in f.summary]
    assert added


def test_an_error_with_numbers_is_not_read_through_the_priors() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 23.65 GiB of which 1.00 GiB is free.\n"
    )

    result = explain_text(text)

    assert BARE_WARNING not in result.warnings
    assert not any("cannot tell" in f.summary for f in result.findings)


def test_equal_confidence_goes_to_the_commoner_cause() -> None:
    assert prior_rank("activations-too-large") < prior_rank("fragmentation")
    assert prior_rank("not-a-rule") == len(INCIDENTS_BY_CAUSE)


def test_a_bare_error_is_read_through_the_causes_its_framework_can_have() -> None:
    assert "framework-preallocation" not in common_causes("pytorch")
    # A request too large is read from the request, never guessed.
    assert "single-allocation-too-large" not in common_causes("unknown", None)
    assert "eval-without-no-grad" not in common_causes("tensorflow")
    assert common_causes("pytorch")[0] == "activations-too-large"


def test_when_no_cause_stands_out_the_commonest_ones_are_named_as_weak() -> None:
    # The job held almost the whole card and asked for a little more: any of several causes.
    text = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB (GPU 0; "
        "10.73 GiB total capacity; 9.85 GiB already allocated; 46.44 MiB free; 9.86 GiB "
        "reserved in total by PyTorch)\n"
    )

    result = explain_text(text)

    added = [f for f in result.findings if "No cause stands out" in f.summary]
    assert added and all(f.confidence < 0.4 for f in added)
    # The job itself held 9.85 of 10.73 GiB: no other process can have filled the card, and
    # the next commonest cause takes that place.
    named = {f.rule for f in result.findings}
    assert "other-process" not in named
    assert named >= set(common_causes("pytorch", 4)) - {"other-process"}
    assert BARE_WARNING not in result.warnings


def test_other_processes_stay_a_common_cause_when_the_job_held_little_of_the_card() -> None:
    text = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB (GPU 0; "
        "10.73 GiB total capacity; 2.10 GiB already allocated; 46.44 MiB free; 2.20 GiB "
        "reserved in total by PyTorch)\n"
    )

    assert "other-process" in {f.rule for f in explain_text(text).findings}


def test_a_cause_that_stands_out_is_not_padded_with_common_ones() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 23.65 GiB of which 1.00 GiB is free. Process 77 has 20.00 GiB memory "
        "in use. Including non-PyTorch memory, this process has 2.50 GiB memory in use. Of the "
        "allocated memory 2.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by "
        "PyTorch but unallocated.\n"
    )

    result = explain_text(text)

    assert result.findings[0].rule == "other-process"
    assert not any("stands out" in f.summary for f in result.findings)
