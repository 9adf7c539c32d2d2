"""Whether this machine has an accelerator a framework could use, from the kernel's own
signs of one: cheap (a few `stat` calls), and asked before anything loads a driver library.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

# NVIDIA's kernel module and its control node; WSL2's GPU; AMD's ROCm; TPUs and other
# accel-class devices. The module's /proc entry is there as soon as it is loaded, even
# where its /dev nodes are made on first use.
NVIDIA_SIGNS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")
ACCELERATOR_SIGNS = (*NVIDIA_SIGNS, "/dev/kfd", "/dev/accel0", "/dev/accel/accel0")


def present(signs: Iterable[str] = ACCELERATOR_SIGNS) -> bool:
    """True when any of `signs` exists."""
    return any(os.path.exists(sign) for sign in signs)
