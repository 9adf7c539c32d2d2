"""What a failing stack says the program was doing, each cue with a stack that shows it and
one that nearly does."""

from __future__ import annotations

import pytest

from memdoc.oom.stackcues import StackCues, is_convolution, stack_cues

TORCH = "site-packages/torch"
_MODULE_CALL = (
    f"{TORCH}/nn/modules/module.py:1736:_wrapped_call_impl",
    f"{TORCH}/nn/modules/module.py:1747:_call_impl",
)
FORWARD = ("train.py:40:main", *_MODULE_CALL, f"{TORCH}/nn/modules/linear.py:125:forward")
BACKWARD = (
    "train.py:41:main",
    f"{TORCH}/_tensor.py:626:backward",
    f"{TORCH}/autograd/__init__.py:347:backward",
    f"{TORCH}/autograd/graph.py:823:_engine_run_backward",
)
ADAM_INIT = (
    "train.py:64:main",
    f"{TORCH}/optim/optimizer.py:530:wrapper",
    f"{TORCH}/optim/adam.py:238:step",
    f"{TORCH}/optim/adam.py:182:_init_group",
)
CLOSURE = (
    "train.py:64:main",
    f"{TORCH}/optim/adam.py:220:step",
    "train.py:50:closure",
    *_MODULE_CALL,
    f"{TORCH}/nn/modules/linear.py:125:forward",
)


def cues(*frames: str) -> StackCues:
    return stack_cues(frames)


def test_no_stack_says_nothing() -> None:
    assert stack_cues(()) == StackCues()


def test_the_pass_of_a_step_backward_before_forward() -> None:
    assert cues(*FORWARD).phase == "forward"
    assert cues(*BACKWARD).phase == "backward"
    # Backward runs the forward's modules' hooks: the innermost pass named is backward.
    assert cues(*FORWARD[:1], *BACKWARD[1:], *_MODULE_CALL).phase == "backward"
    assert cues("train.py:30:main", f"{TORCH}/nn/functional.py:4315:mse_loss").phase is None


def test_a_loss_function_the_step_calls_is_computing_the_loss() -> None:
    assert cues("train.py:70:main", f"{TORCH}/nn/functional.py:3555:cross_entropy").computing_loss
    assert cues("t.py:9:step", f"{TORCH}/nn/functional.py:3300:kl_div").computing_loss
    assert cues("t.py:9:step", f"{TORCH}/nn/functional.py:4315:mse_loss").computing_loss
    # Near misses: another function of the same file, a loss of the program's own
    assert not cues("t.py:9:step", f"{TORCH}/nn/functional.py:2140:softmax").computing_loss
    assert not cues("t.py:9:step", "losses.py:12:contrastive_loss").computing_loss


def test_an_optimizer_making_its_state_and_a_closure_it_called() -> None:
    made = cues(*ADAM_INIT)
    assert made.optimizer and made.making_optimizer_state and not made.optimizer_closure
    stepping = cues(*ADAM_INIT[:3])
    assert stepping.optimizer and not stepping.making_optimizer_state
    closure = cues(*CLOSURE)
    assert closure.optimizer and closure.optimizer_closure and closure.phase == "forward"


@pytest.mark.parametrize(
    ("function", "made"),
    [
        pytest.param("init_shampoo", True, id="init-shampoo"),
        pytest.param("adam_init", True, id="adam-init"),
        pytest.param("create_opt_state", True, id="create-opt-state"),
        pytest.param("init_params", False, id="the-model's-weights"),
        pytest.param("update_momentum", False, id="an-update-not-a-making"),
    ],
)
def test_the_programs_own_function_making_an_optimizers_state(function: str, made: bool) -> None:
    eye = "site-packages/jax/_src/numpy/lax_numpy.py:5771:eye"
    found = cues("train.py:141:main", f"train.py:80:{function}", "train.py:73:for_weight", eye)
    assert found.making_optimizer_state is made and found.optimizer is made
    assert found.own_optimizer_state == (f"train.py:80:{function}" if made else None)
    # The same name in a library's file is not the program's own optimizer.
    assert cues("train.py:141:main", f"site-packages/lib/opt.py:80:{function}", eye) == cues(
        "train.py:141:main", "site-packages/lib/opt.py:80:other", eye
    )


@pytest.mark.parametrize(
    ("frame", "loading"),
    [
        pytest.param(f"{TORCH}/serialization.py:1384:load", True, id="torch-load"),
        pytest.param("site-packages/safetensors/torch.py:311:load_file", True, id="safetensors"),
        pytest.param("train.py:20:load_checkpoint", True, id="function-named-for-it"),
        pytest.param("ckpt/checkpoint_io.py:20:read_shard", True, id="file-named-for-it"),
        pytest.param(f"{TORCH}/utils/checkpoint.py:496:checkpoint", False, id="recompute"),
        pytest.param(f"{TORCH}/utils/data/dataloader.py:630:__next__", False, id="data-loader"),
    ],
)
def test_loading_a_checkpoint_is_not_activation_checkpointing(frame: str, loading: bool) -> None:
    assert cues("train.py:10:main", frame).loading_checkpoint is loading


def test_data_loading_and_a_function_that_loads_are_told_apart() -> None:
    loader = cues("train.py:10:main", f"{TORCH}/utils/data/dataloader.py:630:__next__")
    assert loader.data_loading and not loader.loading  # "load" is not a word of "dataloader"
    pretrained = cues("serve.py:5:main", "site-packages/transformers/x.py:9:from_pretrained")
    assert pretrained.loading and pretrained.moving_weights and not pretrained.data_loading


def test_building_weights_in_a_constructor_and_drawing_them_in_jax() -> None:
    built = cues("m.py:3:main", "m.py:9:__init__", f"{TORCH}/nn/modules/linear.py:106:__init__")
    assert built.building_weights and built.in_constructor
    called = cues("m.py:3:main", "m.py:12:__init__", "m.py:20:helper")
    assert not called.in_constructor and not called.building_weights
    drawn = cues("m.py:3:main", "site-packages/jax/_src/random.py:700:normal")
    assert drawn.drawing_random
    assert not cues(
        "m.py:3:main", "site-packages/jax/_src/numpy/lax_numpy.py:1:zeros"
    ).drawing_random


def test_evaluation_its_frame_and_gradients_turned_off() -> None:
    evaluating = cues("train.py:86:main", "train.py:55:evaluate", *FORWARD[1:])
    assert evaluating.evaluation and evaluating.evaluation_frame == "train.py:55:evaluate"
    assert not evaluating.grad_off
    decorated = cues(
        "train.py:86:main",
        f"{TORCH}/utils/_contextlib.py:116:decorate_context",
        "train.py:55:evaluate",
    )
    assert decorated.evaluation and decorated.grad_off
    assert cues("evaluate.py:10:<module>", *FORWARD[1:]).evaluation  # a script named for it
    assert not cues("latest.py:10:<module>", *FORWARD[1:]).evaluation  # "test" is no word here


def test_the_program_frame_that_called_the_model() -> None:
    assert cues(*FORWARD).model_caller == "train.py:40:main"
    assert cues(*FORWARD[1:]).model_caller is None  # only library frames
    wrapped = cues("job.py:7:epoch_end", "/x/memdoc/collectors/autograd.py:50:backward")
    assert wrapped.model_caller == "job.py:7:epoch_end"


def test_a_collective_needs_its_file_and_its_name_in_one_frame() -> None:
    in_c10d = f"{TORCH}/distributed/distributed_c10d.py:2501:all_reduce"
    assert cues("ddp.py:30:main", in_c10d).collective
    assert not cues("ddp.py:30:all_reduce_metrics", f"{TORCH}/distributed/x.py:1:helper").collective


def test_cuda_graph_capture_and_convolutions_by_whole_words() -> None:
    assert cues("serve.py:3:main", f"{TORCH}/cuda/graphs.py:200:capture_begin").cuda_graph_capture
    assert not cues("serve.py:3:main", "g.py:1:build_graph").cuda_graph_capture
    assert cues("m.py:3:main", f"{TORCH}/nn/modules/conv.py:549:_conv_forward").convolution
    assert is_convolution("Conv2DBackpropFilter") and not is_convolution("convert_layout")
    assert not is_convolution(None)


def test_the_trainer_adding_a_batchs_outputs_to_those_it_kept() -> None:
    hf = "site-packages/transformers"
    gathering = cues(
        f"{hf}/trainer.py:3015:evaluation_loop",
        f"{hf}/trainer_pt_utils.py:376:add",
        f"{hf}/trainer_pt_utils.py:128:nested_concat",
        f"{hf}/trainer_pt_utils.py:86:torch_pad_and_concatenate",
    )
    assert gathering.gathering_outputs
    predicting = cues(
        f"{hf}/trainer.py:3015:evaluation_loop",
        f"{hf}/trainer.py:3260:prediction_step",
        *FORWARD[1:],
    )
    assert not predicting.gathering_outputs and predicting.phase == "forward"
