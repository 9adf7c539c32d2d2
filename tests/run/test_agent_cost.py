"""What memdoc's agent costs the program it watches: a program that fits its cap plainly must
fit it under `memdoc run`, and on a machine without an accelerator the agent starts no thread
at all (a thread's malloc arena reserves 64 MiB of address space, which a cap the program sets
for itself later would count, or lend to the program's own threads)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memdoc.collectors.devices import ACCELERATOR_SIGNS, present
from memdoc.trace import load_trace
from tests.conftest import memdoc_cmd

pytest.importorskip("torch")

MiB = 1024
CAP_BYTES = 8 << 30  # far above what the program uses: only the cap's presence matters

# A few real training steps, then the process's own figures (KiB, threads).
TRAINS = textwrap.dedent(
    """
    import json, time
    import torch

    torch.set_num_threads(1)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(8):
        optimizer.zero_grad()
        model(torch.randn(64, 256)).square().mean().backward()
        optimizer.step()
    time.sleep(0.3)
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    kib = {k: int(status[k].split()[0]) for k in ("VmPeak", "VmHWM")}
    print("FIGURES " + json.dumps({**kib, "Threads": int(status["Threads"])}), flush=True)
    """
)


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))


def _figures(cmd: list[str], cwd: Path, *, capped: bool = True) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDOC")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        preexec_fn=_capped if capped else None,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
    assert lines, done.stderr[-2000:]
    figures: dict[str, int] = json.loads(lines[-1].removeprefix("FIGURES "))
    return figures


def test_under_an_address_space_cap_the_agent_adds_under_16_mib_of_address_space(
    tmp_path: Path,
) -> None:
    (tmp_path / "trains.py").write_text(TRAINS)
    plain = _figures([sys.executable, "trains.py"], tmp_path)
    watched = _figures(memdoc_cmd("run", "-q", "-o", "t.memdoc", "trains.py"), tmp_path)

    # Measured: about 1 MiB of address space and resident (memdoc's modules), no thread;
    # two threads cost 144 MiB (an 8 MiB stack and a 64 MiB malloc arena each).
    assert watched["VmPeak"] - plain["VmPeak"] < 16 * MiB
    assert watched["VmHWM"] - plain["VmHWM"] < 8 * MiB
    assert watched["Threads"] == plain["Threads"]
    # and it still saw every step
    assert [e.data["step"] for e in load_trace(tmp_path / "t.memdoc").steps()] == list(range(1, 9))


@pytest.mark.skipif(
    present(ACCELERATOR_SIGNS),
    reason="an accelerator is present: the agent samples its counters on a thread",
)
def test_without_a_cap_or_an_accelerator_the_agent_starts_no_thread(tmp_path: Path) -> None:
    (tmp_path / "trains.py").write_text(TRAINS)
    plain = _figures([sys.executable, "trains.py"], tmp_path, capped=False)
    watched = _figures(
        memdoc_cmd("run", "-q", "-o", "t.memdoc", "trains.py"), tmp_path, capped=False
    )

    # A thread would add one to the count and about 72 MiB of address space (stack, arena).
    assert watched["Threads"] == plain["Threads"]
    assert watched["VmPeak"] - plain["VmPeak"] < 16 * MiB
    assert [e.data["step"] for e in load_trace(tmp_path / "t.memdoc").steps()] == list(range(1, 9))
