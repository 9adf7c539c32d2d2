"""A data-parallel job on CPU (gloo) where one rank runs out of host memory.

Every rank does a few all-reduce steps; the rank named by FAIL_RANK then caps its own
address space (RLIMIT_AS) and asks for more than the cap leaves: a real MemoryError. The
other ranks fail at their next collective, as ranks of a real job do.
"""

import datetime
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

FAIL_RANK = int(os.environ.get("FAIL_RANK", "3"))
STEPS_BEFORE = 5


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS_BEFORE + 20):
        if rank == FAIL_RANK and step == STEPS_BEFORE:
            with open("/proc/self/statm") as statm:
                vms = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            cap = vms + 256 * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            hoard = bytearray(2 * 1024 * 1024 * 1024)  # beyond the cap: MemoryError
            del hoard
        loss = model(torch.randn(32, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
