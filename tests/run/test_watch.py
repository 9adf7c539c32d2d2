"""`memdoc.watch` in real programs: it never stops the user's training, and says what it did."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memdoc.trace import EventKind, load_trace


def _python(folder: Path, source: str) -> subprocess.CompletedProcess[str]:
    (folder / "train.py").write_text(textwrap.dedent(source))
    env = dict(os.environ)
    env.pop("MEMDOC_AGENT", None)
    return subprocess.run(
        [sys.executable, "train.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


BLOCK = """
    import memdoc
    with memdoc.watch("run.memdoc", interval=0.05) as w:
        w.step()
    print("trained", w.path)
"""


def test_rerunning_a_script_keeps_the_first_trace_and_records_under_a_fresh_name(
    tmp_path: Path,
) -> None:
    first = _python(tmp_path, BLOCK)
    assert first.returncode == 0, first.stderr
    before = (tmp_path / "run.memdoc").read_bytes()

    second = _python(tmp_path, BLOCK)

    assert second.returncode == 0, second.stderr
    assert "trained run-1.memdoc" in second.stdout
    assert (tmp_path / "run.memdoc").read_bytes() == before
    assert load_trace(tmp_path / "run-1.memdoc").complete
    said = [line for line in second.stderr.splitlines() if "run-1.memdoc" in line]
    assert len(said) == 2  # the note, and the summary's trace line
    assert "run.memdoc exists" in said[0] and "force=True" in said[0]


def test_force_overwrites_the_trace(tmp_path: Path) -> None:
    (tmp_path / "run.memdoc").write_text("an old trace\n")
    done = _python(tmp_path, BLOCK.replace("interval=0.05", "interval=0.05, force=True"))
    assert done.returncode == 0, done.stderr
    assert "trained run.memdoc" in done.stdout
    assert load_trace(tmp_path / "run.memdoc").complete
    assert not (tmp_path / "run-1.memdoc").exists()


@pytest.mark.parametrize(
    "blocker",
    [
        pytest.param(
            "read-only folder",
            id="read-only-folder",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder"),
        ),
        pytest.param("a file", id="a-file-in-the-folders-place"),
    ],
)
def test_an_unwritable_folder_warns_once_and_the_block_runs_unobserved(
    tmp_path: Path, blocker: str
) -> None:
    locked = tmp_path / "locked"
    if blocker == "a file":
        locked.write_text("not a folder\n")
    else:
        locked.mkdir(mode=0o500)
    source = """
        import memdoc
        for epoch in range(3):
            with memdoc.watch("locked/run.memdoc") as w:
                w.step()
                memdoc.mark("eval")
            print("epoch", epoch, "done")
    """
    done = _python(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"epoch {i} done" for i in range(3)]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "locked/run.memdoc" in lines[0] and "unobserved" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_missing_folder_warns_and_the_block_runs_unobserved(tmp_path: Path) -> None:
    source = """
        import memdoc
        with memdoc.watch("no/such/folder/run.memdoc") as w:
            w.step()
        print("trained")
    """
    done = _python(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained\n"
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "unobserved" in done.stderr and "Traceback" not in done.stderr


def test_an_exception_caught_outside_the_block_is_not_called_uncaught(tmp_path: Path) -> None:
    source = """
        import memdoc
        try:
            with memdoc.watch("run.memdoc", interval=0.05):
                raise ValueError("batch too odd")
        except ValueError:
            print("handled; the program goes on")
    """
    done = _python(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert "uncaught" not in done.stderr
    assert "exit code" not in done.stderr
    assert "ValueError raised out of the watched block" in done.stderr
    trace = load_trace(tmp_path / "run.memdoc")
    assert [e.data["where"] for e in trace.events(EventKind.EXCEPTION)] == ["watch"]
    assert trace.exit is not None and trace.exit.exit_code is None


def test_a_decorated_function_called_twice_keeps_both_traces(tmp_path: Path) -> None:
    source = """
        import memdoc

        @memdoc.watch("fit.memdoc", quiet=True)
        def fit():
            memdoc.step()

        for _ in range(3):
            fit()
        print("fitted")
    """
    done = _python(tmp_path, source)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in tmp_path.glob("*.memdoc"))
    assert names == ["fit-1.memdoc", "fit-2.memdoc", "fit.memdoc"]
    assert all(load_trace(tmp_path / n).complete for n in names)
    notes = [line for line in done.stderr.splitlines() if "fit.memdoc exists" in line]
    assert len(notes) == 1, done.stderr


@pytest.mark.parametrize(
    ("definition", "call"),
    [
        pytest.param(
            "async def work():\n"
            "    await asyncio.sleep(0.4)\n"
            "    memdoc.step()\n"
            "    raise ValueError('inside')\n",
            "asyncio.run(work())",
            id="coroutine",
        ),
        pytest.param(
            "def work():\n"
            "    got = yield 1\n"
            "    time.sleep(0.4)\n"
            "    memdoc.step()\n"
            "    yield got\n"
            "    raise ValueError('inside')\n",
            "g = work()\nnext(g)\nassert g.send(7) == 7\nnext(g)",
            id="generator",
        ),
        pytest.param(
            "async def work():\n"
            "    got = yield 1\n"
            "    await asyncio.sleep(0.4)\n"
            "    memdoc.step()\n"
            "    yield got\n"
            "    raise ValueError('inside')\n",
            "async def drive():\n"
            "    g = work()\n"
            "    await g.__anext__()\n"
            "    assert await g.asend(7) == 7\n"
            "    await g.__anext__()\n"
            "asyncio.run(drive())",
            id="async-generator",
        ),
    ],
)
def test_a_decorated_coroutine_or_generator_is_watched_while_it_runs(
    tmp_path: Path, definition: str, call: str
) -> None:
    source = (
        "import asyncio, time\nimport memdoc\n\n"
        '@memdoc.watch("work.memdoc", quiet=True)\n'
        f"{definition}\n"
        f"try:\n{textwrap.indent(call, '    ')}\n"
        "except ValueError as error:\n    print('caught', error)\n"
    )
    done = _python(tmp_path, source)

    assert done.returncode == 0, done.stderr
    assert done.stdout == "caught inside\n"
    trace = load_trace(tmp_path / "work.memdoc")
    assert trace.complete and trace.duration_s >= 0.35
    assert len(trace.events(EventKind.STEP)) == 1
    assert [e.data["where"] for e in trace.events(EventKind.EXCEPTION)] == ["watch"]
