"""A traceback's frames as the recogniser reads them, and how a frame is matched."""

from __future__ import annotations

from typing import Any

import pytest

from memdoc.oom.frames import file_name, frame_matches, frame_parts, in_file, read_traceback
from memdoc.oom.names import has_stem

TRACEBACK = """\
Traceback (most recent call last):
  File "/job/train.py", line 12, in main
    loss.backward()
  File "/venv/torch/_tensor.py", line 522, in backward
    ^^^^^^^^
RuntimeError: CUDA out of memory."""


def test_the_last_traceback_gives_frames_and_their_code() -> None:
    stack, source = read_traceback(["Traceback (most recent call last):", *TRACEBACK.split("\n")])
    assert stack == ["/job/train.py:12:main", "/venv/torch/_tensor.py:522:backward"]
    assert source == ["loss.backward()"]  # a caret line is not code


def test_a_frame_comes_apart_even_with_colons_in_its_path() -> None:
    assert frame_parts(r"C:\job\train.py:12:main") == (r"C:\job\train.py", 12, "main")
    assert frame_parts("no line here") == ("no line here", None, "")
    assert file_name(r"C:\job\train.py") == file_name("/job/train.py") == "train.py"


@pytest.mark.parametrize(
    ("kwargs", "matches"),
    [
        pytest.param({"file_pattern": r"torch[/\\]optim[/\\]"}, True, id="file"),
        pytest.param({"function_pattern": "step"}, True, id="whole-function"),
        pytest.param({"function_pattern": "ste"}, False, id="part-of-function"),
        pytest.param({"function_words": ("init group",)}, False, id="words-elsewhere"),
        pytest.param({"file_words": ("adam",)}, True, id="file-words"),
    ],
)
def test_a_frame_passes_every_test_given(kwargs: dict[str, Any], matches: bool) -> None:
    assert frame_matches("/venv/torch/optim/adam.py:88:step", **kwargs) is matches


def test_a_file_pattern_is_matched_anywhere_without_case() -> None:
    assert in_file("/venv/Torch/Utils/checkpoint.py", r"torch[/\\]utils[/\\]checkpoint\.py")


def test_a_stem_is_found_anywhere_in_a_name() -> None:
    assert has_stem("Validation loop", ("valid",))
    assert not has_stem("train", ("valid", "eval"))
