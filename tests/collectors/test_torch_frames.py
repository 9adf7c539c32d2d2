"""The module a memory error came out of, read from its traceback on real PyTorch modules."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from memdoc.collectors.torch_frames import module_in_hand  # noqa: E402


class RunsOut(nn.Module):
    """Fails as an allocation would, after the layers before it ran."""

    def forward(self, x: Any) -> Any:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1")


class Teacher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), RunsOut())

    def forward(self, x: Any) -> Any:
        hidden = self.body[0](x)
        return self.body[1:](hidden)


class Student(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.teacher = Teacher().eval()
        self.norm = nn.BatchNorm1d(4).eval()  # frozen statistics in a model that trains

    def forward(self, x: Any) -> Any:
        return self.norm(self.teacher(x))


def _error(call: Any) -> BaseException:
    try:
        call()
    except RuntimeError as exc:
        return exc
    raise AssertionError("no error")


def test_a_model_in_eval_mode_recording_a_graph_is_named() -> None:
    teacher = Teacher().eval()
    found = module_in_hand(_error(lambda: teacher(torch.ones(2, 4))), torch)
    assert found == {"module": "Teacher", "training": False, "recording_graph": True}


def test_the_same_model_under_no_grad_records_nothing() -> None:
    teacher = Teacher().eval()

    def call() -> None:
        with torch.no_grad():
            teacher(torch.ones(2, 4))

    found = module_in_hand(_error(call), torch)
    assert found == {"module": "Teacher", "training": False, "recording_graph": False}


def test_a_part_in_eval_mode_inside_a_model_that_trains_is_the_training_model() -> None:
    student = Student().train()
    student.teacher.eval()
    found = module_in_hand(_error(lambda: student(torch.ones(2, 4))), torch)
    assert found == {"module": "Student", "training": True}


def test_an_error_outside_any_module_names_none() -> None:
    assert module_in_hand(_error(lambda: torch.ones(2).view(3)), torch) is None
