"""`%load_ext memdoc` and `%%memdoc` in a real notebook run by nbclient on a real ipykernel."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from memdoc.trace import load_run
from memdoc.trace.model import EventKind

SETUP = "import torch\n%load_ext memdoc"
LOOP = """%%memdoc loop.memdoc
import memdoc
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    memdoc.step()
"""
CAP = """import resource
_, hard = resource.getrlimit(resource.RLIMIT_AS)
with open("/proc/self/statm") as statm:
    size_bytes = int(statm.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size_bytes + 2 * 2**30, hard))
"""
OOM = "%%memdoc oom.memdoc --report\ntorch.empty(8 * 2**30, dtype=torch.uint8)"
AFTER = "print('kernel still alive')"
BAD = "%%memdoc one.memdoc two.memdoc\nprint('not run')"
MISSING = "%memdoc_report missing.memdoc"


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `python3` kernelspec that runs this interpreter, with this tree on the path."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    kernel = {"argv": argv, "display_name": "memdoc test", "language": "python", "env": env}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))


def _texts(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.outputs:
        parts.append(output.get("text", ""))
        data = output.get("data", {})
        parts.append(data.get("text/plain", ""))
        parts.append(data.get("text/html", ""))
        parts.extend(output.get("traceback", []))
    return "\n".join(parts)


@pytest.mark.slow
def test_cell_magic_shows_the_diagnosis_and_links_the_report(
    tmp_path: Path, kernel_env: None
) -> None:
    notebook = nbformat.v4.new_notebook()
    cells = [SETUP, LOOP, CAP, OOM, AFTER, BAD, MISSING]
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=300,
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )

    client.execute()

    loop, oom, after = notebook.cells[1], notebook.cells[3], notebook.cells[4]
    assert "peak host" in _texts(loop)
    assert (tmp_path / "loop.memdoc").exists()
    oom_text = _texts(oom)
    assert "DefaultCPUAllocator: can't allocate memory" in oom_text
    assert "Ran out of host memory under its" in oom_text  # the cell set an address-space cap
    assert "<pre" in oom_text  # the diagnosis as HTML where the front end shows it
    assert load_run([tmp_path / "oom.memdoc"]).primary.events(EventKind.OOM)
    assert (tmp_path / "oom.html").exists()
    assert 'href="' in oom_text and "oom.html" in oom_text
    assert "kernel still alive" in _texts(after)
    bad = _texts(notebook.cells[5])
    assert "usage: %%memdoc [TRACE] [--report]" in bad
    assert "not run" not in bad and "Traceback" not in bad
    missing = _texts(notebook.cells[6])
    assert "memdoc: missing.memdoc: no such file" in missing
    assert "Traceback" not in missing and "error" not in {
        o.output_type for o in notebook.cells[6].outputs
    }


def _run(tmp_path: Path, cells: list[str], *, allow_errors: bool) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=120,
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    return notebook


def test_a_cell_whose_code_raises_fails_as_it_would_without_the_magic(
    tmp_path: Path, kernel_env: None
) -> None:
    cells = ["%load_ext memdoc", "%%memdoc b.memdoc\nraise ValueError('boom')", "print('went on')"]
    notebook = nbformat.v4.new_notebook()

    with pytest.raises(CellExecutionError) as raised:
        notebook = _run(tmp_path, cells, allow_errors=False)

    assert raised.value.ename == "ValueError" and raised.value.evalue == "boom"
    assert (tmp_path / "b.memdoc").exists()
    assert not notebook.cells or not notebook.cells[2].outputs


def test_the_diagnosis_is_one_output_and_a_bad_line_is_a_usage_message(
    tmp_path: Path, kernel_env: None
) -> None:
    cells = [
        "%load_ext memdoc",
        "%%memdoc a.memdoc\nx = 1",
        "%%memdoc b.memdoc\nraise ValueError('boom')",
        "%memdoc_report 'abc",
        "%%memdoc 'abc\nprint('not run')",
    ]

    notebook = _run(tmp_path, cells, allow_errors=True)

    quiet, failed, report, magic = notebook.cells[1:]
    assert [o.output_type for o in quiet.outputs] == ["display_data"]
    assert "peak host" in _texts(quiet) and "\x1b[" not in _texts(quiet)
    kinds = sorted(o.output_type for o in failed.outputs)
    assert kinds == ["display_data", "error"]
    assert "ValueError raised out of the watched block" in _texts(failed)
    assert [e for e in failed.outputs if e.output_type == "error"][0].ename == "ValueError"
    for cell in (report, magic):
        assert [o.output_type for o in cell.outputs] == ["display_data"], cell.outputs
        assert "usage: %" in _texts(cell) and "Traceback" not in _texts(cell)
