"""The cues the recogniser reads from a device memory error's words and the log around it."""

from __future__ import annotations

import pytest

from memdoc.oom.growthcues import GrowthCues, growth_cues
from memdoc.oom.textcues import MessageCues, TextCues, message_cues, text_cues


@pytest.mark.parametrize(
    ("text", "cue"),
    [
        pytest.param(
            "Scratch allocation of 4GiB exceeds the memory limit of 2GiB",
            "workspace_limit",
            id="tf-autotune-cap",
        ),
        pytest.param("RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes", "xla_out_of_memory"),
        pytest.param("Can't reduce memory use below 3G by rematerialization", "xla_buffer_plan"),
        pytest.param("5 out of the last 5 calls triggered tf.function retracing", "retracing"),
        pytest.param("loss.backward(retain_graph = True)", "retain_graph", id="retain-graph"),
        pytest.param("UserWarning: volatile was removed and now has no effect", "volatile"),
        pytest.param("op training/Adam_1/m/Assign", "optimizer_state"),
        pytest.param("Loading checkpoint shards:  50%", "moving_weights", id="hf-shards"),
        pytest.param("model.to('cuda')", "moving_weights", id="to-cuda"),
        pytest.param("[[node dense/kernel/Initializer/random_uniform", "variable_initializer"),
        pytest.param("model.load_state_dict(state)", "checkpoint_loading"),
        pytest.param("Capturing the model for CUDA graphs.", "cuda_graph_capture", id="vllm"),
    ],
)
def test_each_idea_is_read_from_its_own_table(text: str, cue: str) -> None:
    said = text_cues([text])
    assert getattr(said, cue)
    assert [name for name, value in vars(said).items() if value] == [cue]


def test_a_cue_is_said_in_any_of_the_texts() -> None:
    # GIVEN the words only in the traceback's code, after a message that does not say them
    said = text_cues(["CUDA out of memory.", "", "loss.backward(create_graph=True)"])
    assert said.retain_graph


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param("import torch.nn as nn; import tensorflow as tf", ("pytorch", "tensorflow")),
        pytest.param("jaxlib.xla_extension.XlaRuntimeError", ("jax",), id="jaxlib"),
        pytest.param(
            "external/org_tensorflow/tensorflow/compiler/xla/pjrt", (), id="jaxlibs-vendored-tf"
        ),
    ],
)
def test_the_frameworks_a_text_names_come_in_one_order(text: str, named: tuple[str, ...]) -> None:
    assert text_cues([text]).frameworks_named == named


def test_words_that_only_resemble_a_cue_say_nothing() -> None:
    assert text_cues(["torchvision loaded; the graph was built", ""]) == TextCues()


def test_vllms_figures_are_read_from_its_message() -> None:
    message = (
        "ValueError: The model's max seq len (4096) is larger than the maximum number of "
        "tokens that can be stored in KV cache (3664)."
    )
    assert message_cues(message) == MessageCues(kv_max_len=4096, kv_tokens_that_fit=3664)
    assert message_cues("No available memory for the cache blocks.").kv_nothing_left


def test_a_cuda_runtime_calls_words_are_not_the_allocators() -> None:
    assert message_cues("RuntimeError: CUDA error: out of memory").cuda_runtime_call
    assert not message_cues("CUDA out of memory. Tried to allocate 2 GiB").cuda_runtime_call


@pytest.mark.parametrize(
    ("log", "progress"),
    [
        pytest.param("Epoch 37/100 ... Epoch 38/100", 38, id="furthest-epoch"),
        pytest.param("the 1000th iteration", 1000, id="ordinal"),
        pytest.param("step: 800", 800, id="step"),
        pytest.param("stepping through", None, id="no-number"),
    ],
)
def test_progress_is_the_furthest_count_the_log_reached(log: str, progress: int | None) -> None:
    assert growth_cues("CUDA out of memory.", log).progress == progress


def test_a_leak_is_quoted_as_the_text_wrote_it() -> None:
    cues = growth_cues("CUDA out of memory.", "I think the Memory Leak is in my eval loop")
    assert cues == GrowthCues(leak_words="Memory Leak")


def test_trainers_metric_settings_are_names_matched_with_case() -> None:
    assert growth_cues("", "pass eval_accumulation_steps=4").kept_for_metrics == (
        "eval_accumulation_steps"
    )
    assert growth_cues("", "EVAL_ACCUMULATION_STEPS").kept_for_metrics is None


def test_only_the_end_of_a_long_log_is_read() -> None:
    log = "epoch 99\n" + "x" * 30_000
    assert growth_cues("", log).progress is None
