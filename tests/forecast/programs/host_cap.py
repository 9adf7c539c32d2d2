"""Hold this process to a memory budget with an address-space cap (RLIMIT_AS), as a small
GPU would: the program then fails in seconds instead of swapping the machine."""

from __future__ import annotations

import resource


def cap_address_space(budget_bytes: int) -> int:
    """Allow `budget_bytes` more address space than is mapped now; return the cap."""
    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped_bytes + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap
