"""Train on a GPU that another job still holds: a notebook kernel or an earlier run left behind.

Nothing is wrong with the training code. Another process, not part of this job, keeps 70% of
the GPU, so a step that needs 45% of the GPU fails. The error text names the other process
("Process 4242 has 80.00 GiB memory in use"); `nvidia-smi` or `memdoc top` shows who it is.

To reproduce it without a second terminal, the script starts that other job itself, the way
it would run on its own: its own environment and session, not a child of this process.
GPU only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

LEFTOVER_JOB = """
import os, sys, time, torch
held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
open(sys.argv[2], "w").close()
while os.path.exists(f"/proc/{sys.argv[3]}"):  # here it stops when the example is gone
    time.sleep(0.5)
"""
# Starts the leftover job in its own session and exits at once, so that it is nobody's child.
LAUNCHER = """
import subprocess, sys
job = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]],
                       start_new_session=True, stdout=subprocess.DEVNULL)
print(job.pid)
"""


def start_leftover_job(nbytes: int) -> int:
    """Start a process that holds `nbytes` of GPU 0 until killed; returns its PID."""
    ready = Path(tempfile.mkdtemp()) / "ready"
    kept = ("PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
    env = {k: os.environ[k] for k in kept if k in os.environ}
    job_args = [str(nbytes), str(ready), str(os.getpid())]
    launched = subprocess.run(
        [sys.executable, "-c", LAUNCHER, LEFTOVER_JOB, *job_args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(launched.stdout)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            sys.exit("the leftover job did not start")
        time.sleep(0.2)
    return pid


def train(device: torch.device, total_bytes: int) -> None:
    width = 8192
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    # A step needs 45% of the GPU (about six values of `width` per sample, forward and
    # backward): fine on an idle GPU, not next to the other job's 70%.
    batch_size = int(0.45 * total_bytes) // (6 * width * 4)
    for step in range(1, 11):
        inputs = torch.randn(batch_size, width, device=device)
        loss = F.mse_loss(model(inputs), inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU")
    device = torch.device("cuda")
    total_bytes = torch.cuda.get_device_properties(device).total_memory
    leftover = start_leftover_job(int(0.7 * total_bytes))
    print(f"another job (PID {leftover}) holds 70% of the GPU", flush=True)
    try:
        train(device, total_bytes)
    finally:
        os.kill(leftover, signal.SIGTERM)


if __name__ == "__main__":
    main()
